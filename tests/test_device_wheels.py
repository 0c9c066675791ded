"""The wheelhouse that travels to the lent GPU machine (scripts/build_device_wheels.py) and the script
that installs it there (scripts/device_gpu_proof.sh): checked here without a download or a GPU.

The download itself, the install into the machine's image and the preflight run in the device
simulation (noxfile.py, session device), which runs this file too.
"""

import base64
import hashlib
import importlib.metadata as metadata
import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from background import background

ROOT = Path(__file__).resolve().parents[1]
SLOW_FIXTURES = ("preflight_without_cuda",)  # pip and the preflight, in the background lane (conftest: slow)
spec = importlib.util.spec_from_file_location("build_device_wheels", ROOT / "scripts" / "build_device_wheels.py")
bdw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bdw)


def test_every_pin_the_image_lacks_travels_at_requirements_version():
    assert bdw.missing_pins(ROOT / "requirements.txt", bdw.IMAGE, bdw.WHEELS_LIST) == []


def test_every_wheel_in_the_list_says_why_it_travels():
    listed = bdw.read_pins(bdw.WHEELS_LIST, reasons=True)
    assert len(listed) > 40 and all(reason for _, reason in listed.values())
    # the transformers the image has lacks the API the proof calls: the pin must travel
    assert listed["transformers"][0] == bdw.read_pins(ROOT / "requirements.txt")["transformers"][0]


def test_a_pin_the_image_lacks_or_has_elsewhere_and_the_list_forgets_is_named(tmp_path):
    (tmp_path / "req.txt").write_text("alpha==1.0  # x\nbeta==2.0\ngamma==3.0\ndelta==4.0\n")
    (tmp_path / "image.txt").write_text("alpha==1.0\nbeta==1.9\ngamma\n")  # gamma: there, version not read
    (tmp_path / "wheels.txt").write_text("beta==1.8  # an old pin\n")
    wrong = bdw.missing_pins(tmp_path / "req.txt", tmp_path / "image.txt", tmp_path / "wheels.txt")
    assert wrong == ["beta==2.0 (the list has 1.8)", "gamma==3.0 (the list lacks it)", "delta==4.0 (the list lacks it)"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("alpha==1.0\n", "alpha==1.0 needs its reason"),
        ("alpha==1.0  # a\nAlpha==1.1  # b\n", "Alpha is listed twice"),
        ("alpha>=1.0  # a range\n", "is not `name==version  # reason`"),
    ],
)
def test_a_bad_list_line_is_refused_by_its_number(tmp_path, text, message):
    (tmp_path / "wheels.txt").write_text(text)
    with pytest.raises(ValueError, match=message):
        bdw.read_pins(tmp_path / "wheels.txt", reasons=True)


def _fake_bnb_wheel(folder: Path, libraries: list[str]) -> Path:
    """A wheel shaped as bitsandbytes' is: a package, native libraries, a dist-info with a RECORD."""
    path = folder / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    info = "bitsandbytes-0.50.2.dist-info"
    files = {"bitsandbytes/__init__.py": b"__version__ = '0.50.2'\n"}
    files |= {f"bitsandbytes/{name}": name.encode() * 1000 for name in libraries}
    files |= {f"{info}/METADATA": b"Metadata-Version: 2.1\nName: bitsandbytes\nVersion: 0.50.2\n"}
    files |= {f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))
    return path


def test_bitsandbytes_is_repacked_to_the_two_libraries_the_machine_loads(tmp_path):
    libraries = ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so", "libbitsandbytes_cuda126.so"]
    wheel = _fake_bnb_wheel(tmp_path, libraries + ["libbitsandbytes_rocm64.so"])
    dropped = bdw.repack(wheel)
    assert sorted(Path(n).name for n in dropped) == ["libbitsandbytes_cuda126.so", "libbitsandbytes_rocm64.so"]
    with zipfile.ZipFile(wheel) as repacked:
        names = repacked.namelist()
        record = repacked.read("bitsandbytes-0.50.2.dist-info/RECORD").decode().splitlines()
        contents = {name: repacked.read(name) for name in names}
    assert "bitsandbytes/libbitsandbytes_cuda130.so" in names and "bitsandbytes/libbitsandbytes_cpu.so" in names
    assert not any("cuda126" in line or "rocm" in line for line in record), "RECORD lists only what is there"
    for line in record:  # every hash pip could check is the file's own
        name, digest, size = line.split(",")
        if digest:
            data = contents[name]
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(pip, check=True)  # pip takes the repacked wheel
    assert sorted(p.name for p in (target / "bitsandbytes").glob("*.so")) == sorted(libraries[:2])


def test_a_bitsandbytes_without_the_cuda130_library_is_refused(tmp_path):
    wheel = _fake_bnb_wheel(tmp_path, ["libbitsandbytes_cuda126.so"])
    with pytest.raises(SystemExit, match="holds none of libbitsandbytes_cpu.so, libbitsandbytes_cuda130.so"):
        bdw.repack(wheel)


def test_two_versions_of_a_package_and_a_set_past_the_limit_are_refused(tmp_path):
    one, two = tmp_path / "Foo_Bar-1.0-py3-none-any.whl", tmp_path / "foo.bar-1.1-py3-none-any.whl"
    one.write_bytes(b"x" * 1000)
    two.write_bytes(b"x" * 1000)
    with pytest.raises(SystemExit, match="Foo_Bar-1.0-py3-none-any.whl, foo.bar-1.1-py3-none-any.whl"):
        bdw.check_set([one, two], tree_bytes=0)
    with pytest.raises(SystemExit, match=r"come to 0\.5 MiB, past the 0 MiB"):
        bdw.check_set([one], tree_bytes=bdw.MIB // 2, limit=bdw.MIB // 4)
    assert bdw.check_set([one], tree_bytes=10) == 1000


def test_the_kits_metadata_wheel_makes_the_install_cell_see_the_kit_installed(tmp_path):
    wheel = bdw.kit_metadata_wheel(tmp_path)
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(pip, check=True)
    # the install cell's own test (helpers.maintainer.notebooks.INSTALL_TEMPLATE), on that folder
    (found,) = metadata.distributions(name=bdw.DISTRIBUTION, path=[str(target)])
    assert found.version == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert [p.name for p in target.iterdir()] == [f"compute_realities_kit-{found.version}.dist-info"], "no code"
    from helpers.maintainer.notebooks import DISTRIBUTION

    assert DISTRIBUTION == bdw.DISTRIBUTION


def _script(*args: str, env: dict) -> subprocess.CompletedProcess:
    command = ["bash", "scripts/device_gpu_proof.sh", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


def test_the_device_script_says_what_to_do_without_its_wheels(tmp_path):
    env = {**os.environ, "DEVICE_WHEELS": str(tmp_path / "none"), "DEVICE_SITE": str(tmp_path / "site")}
    done = _script(str(tmp_path / "out"), env=env)
    assert done.returncode == 2
    assert "run python3 scripts/build_device_wheels.py here first and carry" in done.stdout
    env.pop("OUT", None)
    done = _script(env=env)
    assert done.returncode != 0 and "give the output folder" in done.stderr


@background(seconds=12)
def preflight_without_cuda(folder: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path]:
    """The device script where it expects a card and this machine has none (installs its wheels first: about
    15 s); (its result, its output folder)."""
    wheels = folder / "wheels"
    wheels.mkdir()
    bdw.kit_metadata_wheel(wheels)
    env = {**env, "DEVICE_WHEELS": str(wheels), "DEVICE_SITE": str(folder / "site")}
    env |= {"DEVICE_PYTHON": sys.executable, "DEVICE_MODE": "gpu", "PYTHONPATH": ""}
    return _script(str(folder / "out"), env=env), folder / "out"


def test_the_device_script_fails_its_preflight_fast_and_says_why(preflight_without_cuda):
    """No CUDA where the script expects a card: exit 2 before anything slow, the reason kept in preflight.txt."""
    done, out = preflight_without_cuda
    assert done.returncode == 2, done.stdout + done.stderr
    preflight = (out / "preflight.txt").read_text()
    assert "preflight: failed" in preflight and "nothing else was run" in done.stdout
    assert "sees no CUDA GPU" in preflight  # this machine has none: the real run stops here, within seconds
    assert sorted(p.name for p in out.iterdir()) == ["preflight.txt"]


def test_the_image_file_names_its_source_and_holds_the_old_transformers_it_has():
    text = bdw.IMAGE.read_text()
    assert "KINDS.md" in text and "2026-11-17" in text, "where and when the image was read"
    image = bdw.read_pins(bdw.IMAGE)
    # what the simulation must reproduce: the machine's torch, and the transformers the wheels replace
    assert image["torch"][0] == "2.11.0" and image["transformers"][0] == "5.17.0"


def test_a_pin_pip_cannot_download_is_an_error_that_names_the_list(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(bdw.subprocess, "run", lambda command, **kw: calls.append(command) or _Done(1))
    with pytest.raises(SystemExit, match="pip could not download the wheels .exit 1.*device-wheels.txt"):
        bdw.download({"alpha": ("1.0", "why")}, tmp_path)
    (command,) = calls
    assert command[-1] == "alpha==1.0" and "--no-deps" in command and "manylinux_2_39_x86_64" in command
    assert command[command.index("--python-version") + 1] == "3.12"


class _Done:
    def __init__(self, returncode: int):
        self.returncode = returncode


def _fake_build(monkeypatch, wheels: list[str]) -> list:
    """build() with `wheels` as what pip downloads (no network), no repack, no git; the calls to download."""
    calls = []

    def download(pins, dest):
        calls.append(dest)
        for name in wheels:
            (dest / name).write_bytes(name.encode())

    monkeypatch.setattr(bdw, "download", download)
    monkeypatch.setattr(bdw, "repack", lambda wheel: [])
    monkeypatch.setattr(bdw, "tree_bytes", lambda: 0)
    monkeypatch.setattr(bdw, "commit", lambda: "abc123")
    return calls


def test_a_build_never_deletes_a_wheel_it_did_not_write(tmp_path, monkeypatch, capsys):
    out = tmp_path / "wheels"
    out.mkdir()
    mine = out / "mine-1.0-py3-none-any.whl"
    mine.write_bytes(b"the user's own")
    calls = _fake_build(monkeypatch, ["alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl"])
    with pytest.raises(bdw.UsageError, match=r"holds 1 wheel this script did not write .*: mine-1\.0-py3-none-any"):
        bdw.build(out)
    assert mine.read_bytes() == b"the user's own" and calls == [], "refused before the download, nothing deleted"
    with pytest.raises(SystemExit) as e:  # the command line: a usage error, exit 2, naming a folder that would do
        bdw.main(["--out", str(out)])
    assert e.value.code == 2 and f"--out {out / 'device'}, or move those wheels out of it" in capsys.readouterr().err
    assert mine.exists()


def test_a_build_replaces_only_the_wheels_its_manifest_lists(tmp_path, monkeypatch):
    out = tmp_path / "wheels"
    _fake_build(monkeypatch, ["alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl"])
    bdw.build(out)
    kit = bdw.kit_metadata_wheel(tmp_path).name
    assert sorted(p.name for p in out.glob("*.whl")) == sorted(
        ["alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl", kit]
    )
    assert len((out / bdw.MANIFEST).read_text().splitlines()) == 3
    (out / "notes.txt").write_text("the user's")
    _fake_build(monkeypatch, ["alpha-2.0-py3-none-any.whl"])  # a newer list: the old wheels are this script's own
    bdw.build(out)
    assert sorted(p.name for p in out.glob("*.whl")) == sorted(["alpha-2.0-py3-none-any.whl", kit])
    assert (out / "notes.txt").read_text() == "the user's" and (out / "COMMIT").read_text() == "abc123\n"
    (out / "alpha-2.0-py3-none-any.whl").write_bytes(b"changed by hand since")  # no longer the script's to delete
    with pytest.raises(bdw.UsageError, match=r"alpha-2\.0-py3-none-any\.whl"):
        bdw.build(out)
    assert (out / "alpha-2.0-py3-none-any.whl").read_bytes() == b"changed by hand since"


def test_an_out_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SystemExit) as e:
        bdw.main(["--out", str(afile)])
    assert e.value.code == 2 and f"--out {afile} is a file: name a folder for the wheels" in capsys.readouterr().err
    assert afile.read_text() == "x"
