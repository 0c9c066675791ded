"""helpers.install: what the install cell's pip broke in the runtime's other libraries, mended or named.

The unit tests read fake installed distributions (dist-info folders, which is all importlib.metadata
reads); the end-to-end tests run the install cell itself with real pip in a throwaway venv whose
"runtime" holds a library that caps a dependency of the kit, as Colab's gradio caps huggingface-hub.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from background import background
from test_install_cell import DISTRIBUTION, INSTALL_CELL, KIT_MODULES, KIT_URL, PINS_URL, run_cells, write_wheel

from helpers import install
from helpers.install import RUN_TIME_FLOORS, Broken, broken_requirements

SLOW_FIXTURES = ("capped_runtime",)  # a venv built and pip run in it, in the background lane (conftest: slow)


def dist(site: Path, name: str, version: str, *requires: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder of fake installed distributions that importlib.metadata sees first (and only, for these names)."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_a_cap_the_install_broke_is_found_and_nothing_else(site):
    dist(site, "capper", "1.0", "sharedlib<2.0,>=0.3", "otherlib>=5; extra == 'extras'", "ghostlib<1")
    dist(site, "sharedlib", "2.4.0")
    dist(site, "upgraded", "3.0", "sharedlib<2")  # the kit upgraded it: its requirements are pip's to meet
    dist(site, "alreadybroken", "1.0", "sharedlib<1")  # broken before the install too: not the install's doing
    before = {"capper": "1.0", "sharedlib": "1.27.0", "upgraded": "2.0", "alreadybroken": "1.0"}
    assert broken_requirements(before) == [Broken("capper 1.0", "sharedlib<2.0,>=0.3", "2.4.0")]
    assert str(broken_requirements(before)[0]) == "capper 1.0 needs sharedlib<2.0,>=0.3 (now 2.4.0)"


def test_nothing_changed_nothing_broken(site):
    dist(site, "capper", "1.0", "sharedlib<2.0")
    dist(site, "sharedlib", "1.5")
    assert broken_requirements({"capper": "1.0", "sharedlib": "1.5"}) == []


def test_torchaos_floor_is_the_one_peft_checks():
    # peft raises ImportError in get_peft_model wherever an older torchao is installed (Colab and
    # Kaggle ship 0.10.0): the floor must be peft's own, read from its source
    import inspect

    from peft import import_utils

    source = inspect.getsource(import_utils.is_torchao_available)
    floor, who = RUN_TIME_FLOORS["torchao"]
    assert f'TORCHAO_MINIMUM_VERSION = packaging.version.parse("{floor}")' in source and who == "peft"


# --- the install cell with real pip: a venv whose runtime holds capper 1.0 (sharedlib<2) -------------
# Runs first in the venv's Python: every pip call of the cell, GitHub's URLs pointed at local files
# and PyPI at a folder of wheels (the mending call names neither URL, so neither is required).
OFFLINE_PIP = """
import subprocess, sys

real_run, local, wheels = subprocess.run, {local!r}, {wheels!r}

def pip_offline(args, *a, **kw):
    assert list(args[:4]) == [sys.executable, "-m", "pip", "install"], args
    return real_run([local.get(x, x) for x in args] + ["--no-index", "--find-links", wheels], *a, **kw)

subprocess.run = pip_offline
"""


@background(seconds=6)
def capped_runtime(root: Path, env: dict[str, str]) -> Path:
    """A venv with capper 1.0 (needs sharedlib<2.0), sharedlib 1.0, torchao 0.10.0; newer wheels and the kit."""
    wheels = root / "wheels"
    wheels.mkdir()
    for version in ("1.0", "1.6", "2.0"):
        write_wheel(wheels, "sharedlib", version)
    write_wheel(wheels, "capper", "1.0", ("sharedlib<2.0",))
    for version in ("0.10.0", RUN_TIME_FLOORS["torchao"][0]):
        write_wheel(wheels, "torchao", version)
    write_wheel(wheels, DISTRIBUTION, "0.1.0", ("sharedlib>=1.5",), KIT_MODULES)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120, env=env)
    pip = [
        str(root / "venv" / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--find-links",
        str(wheels),
    ]
    subprocess.run([*pip, "capper==1.0", "sharedlib==1.0", "torchao==0.10.0"], check=True, timeout=120, env=env)
    return root


def install_cell_in(capped_runtime, tmp_path, pins: str) -> tuple[subprocess.CompletedProcess, str]:
    venv = tmp_path / "venv"
    shutil.copytree(capped_runtime / "venv", venv, symlinks=True)
    (tmp_path / "requirements.txt").write_text(pins)
    local = {
        PINS_URL: str(tmp_path / "requirements.txt"),
        KIT_URL: str(next((capped_runtime / "wheels").glob("compute*.whl"))),
    }
    prelude = OFFLINE_PIP.format(local=local, wheels=str(capped_runtime / "wheels"))
    python = str(venv / "bin" / "python")
    done = run_cells([INSTALL_CELL], tmp_path, prelude=prelude, python=python)
    versions = subprocess.run(
        [python, "-c", "import sharedlib, torchao; print(sharedlib.VERSION, torchao.VERSION)"],
        capture_output=True,
        text=True,
    )
    return done, versions.stdout.strip()


def test_the_cell_keeps_a_runtime_library_that_caps_the_kits_dependency(capped_runtime, tmp_path):
    # pip alone takes sharedlib 2.0, the newest, and breaks capper; the mending call finds 1.6, which serves both
    done, versions = install_cell_in(capped_runtime, tmp_path, pins="")
    assert done.returncode == 0, done.stdout + done.stderr
    assert versions == f"1.6 {RUN_TIME_FLOORS['torchao'][0]}", "sharedlib serves capper and the kit; torchao upgraded"
    lines = done.stdout.splitlines()
    assert "Kept working (pip chose versions that serve them too): capper 1.0" in lines, done.stdout
    assert f"torchao 0.10.0 -> {RUN_TIME_FLOORS['torchao'][0]}" in done.stdout and "sharedlib 1.0 -> 1.6" in done.stdout
    assert "Still broken" not in done.stdout and lines[-2:] == ["Installed.", "CELLS DONE"]


def test_a_cap_the_kits_pins_cannot_meet_is_named_with_the_command_that_restores_it(capped_runtime, tmp_path):
    done, versions = install_cell_in(capped_runtime, tmp_path, pins="sharedlib==2.0\n")
    assert done.returncode == 0, done.stdout + done.stderr  # the kit works; the student is told what does not
    assert versions.startswith("2.0 ")
    out = done.stdout
    assert (
        "Still broken by the kit's pins (the course does not use them):\n  capper 1.0 needs sharedlib<2.0 (now 2.0)"
        in out
    )
    assert "After the course, `pip install capper==1.0` restores them" in out
    assert "pip could not serve both; what it said:" in out, out


def test_a_run_time_floor_pip_cannot_meet_stops_the_cell_instead_of_saying_installed(capped_runtime, tmp_path):
    # the pins cap torchao below peft's floor: pip cannot raise it, and peft would refuse it in notebook 06
    done, versions = install_cell_in(capped_runtime, tmp_path, pins="torchao==0.10.0\n")
    floor = RUN_TIME_FLOORS["torchao"][0]
    assert done.returncode != 0 and versions.endswith(" 0.10.0"), done.stdout + done.stderr
    assert "Installed." not in done.stdout.splitlines(), done.stdout
    assert (
        f"pip could not upgrade what it needs at run time: torchao 0.10.0 is below {floor}, which peft refuses"
        in done.stderr
    ), done.stderr
    assert f"Run `!pip install torchao=={floor}` in a new cell, then this cell again" in done.stderr


def test_the_report_says_nothing_where_nothing_changed(site, capsys, monkeypatch):
    monkeypatch.setattr(install.subprocess, "run", lambda *a, **k: pytest.fail("no pip call where nothing is broken"))
    dist(site, "capper", "1.0", "sharedlib<2.0")
    dist(site, "sharedlib", "1.5")
    now = install.versions()
    report = install.keep_runtime_working(now, ["pip"])
    assert report.changed == report.mended == report.broken == [] and capsys.readouterr().out == ""
