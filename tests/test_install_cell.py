"""The install cell: silent and offline where the kit is installed, clear on Kaggle without internet,
never torch, a restart asked for (with the menu to click) when pip replaced a library the session
had imported, and what it would download and replace on a runtime that already has torch.

The cell runs here in a plain Python process, the way the first cells of a notebook run in a
kernel, with the network and every subprocess replaced by a guard that fails the run: a cell that
tried pip or a connection could not pass by accident. The restart check runs the cell with real pip
and importlib.metadata in a throwaway venv, with GitHub and PyPI stood in for by local wheels.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from background import background

from helpers._requirements import canonical_name, read_pins
from helpers.maintainer.notebooks import BRANCH, DISTRIBUTION, INSTALL_CELL, NOTEBOOKS_DIR, REPO_ROOT, REPOSITORY

# a venv, then pip in a copy of it per test; a probe's 10 s bound waited out (the background lane; conftest: slow)
SLOW_FIXTURES = ("runtime_template", "kaggle_lookup_hangs")
IPYNBS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
KIT_URL = f"git+https://github.com/{REPOSITORY}.git@{BRANCH}"
PINS_URL = f"https://raw.githubusercontent.com/{REPOSITORY}/{BRANCH}/requirements.txt"

# Runs first in the process: any connection or program the cells start fails the run, loudly.
GUARD = """
import socket, subprocess

def refuse(*args, **kwargs):
    raise AssertionError(f"GUARD: the cell reached for the network or started a program: {args[:1]!r}")

socket.create_connection = socket.socket.connect = refuse
subprocess.run = subprocess.Popen = subprocess.call = subprocess.check_call = subprocess.check_output = refuse
"""
# A Kaggle session with Settings > Internet off: connections fail at once.
OFFLINE = """
import socket

def offline(*args, **kwargs):
    raise OSError(101, "Network is unreachable")

socket.create_connection = offline
"""
# Each Thread.join the cell makes, printed when it returns: the bound it was given, and whether the
# thread was still running then (alive=True: the cell gave up at the bound; False: the thread had ended).
JOINS = """
import threading

_join = threading.Thread.join

def join(self, timeout=None):
    _join(self, timeout)
    print(f"JOIN {self.name} timeout={timeout} alive={self.is_alive()}", flush=True)

threading.Thread.join = join
"""
# pip as the cell would run it, recorded; it "fails" so the cell's error path runs too.
RECORD_PIP = """
import json, subprocess

def pip(args, *a, **kw):
    pins = open(args[args.index("-c", args.index("-c") + 1) + 1]).read()
    print("PIP", json.dumps({"args": args[1:], "runtime_pins": pins}))
    return subprocess.CompletedProcess(args, 1, "The conflict is caused by: ...", "ERROR: ResolutionImpossible")

subprocess.run = pip
"""


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def run_cells(
    cells: list[str],
    tmp_path: Path,
    *,
    prelude: str = GUARD,
    kit_visible: bool = True,
    env: dict | None = None,
    sys_path: tuple[str, ...] = (),
    python: str = sys.executable,
    session: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `cells` in order in a fresh `python`, after `prelude`; `kit_visible=False` hides site-packages. Its
    environment: `session` (os.environ by default; a background job passes its own) and `env` on top."""
    script = tmp_path / "cells.py"
    body = "".join(f"exec(compile({c!r}, 'cell {i}', 'exec'))\n" for i, c in enumerate(cells))
    script.write_text(f"import sys\nsys.path[:0] = {list(sys_path)!r}\n{prelude}\n{body}print('CELLS DONE')\n")
    base = {
        k: v for k, v in (os.environ if session is None else session).items() if not k.startswith(("KAGGLE_", "COLAB_"))
    }
    base.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, **(env or {}))
    flags = [] if kit_visible else ["-S", "-s"]  # -S: no site-packages, so neither the kit nor torch
    # cwd is a scratch folder: `helpers` must come from the installed kit, not from the checkout
    return subprocess.run(
        [python, *flags, str(script)], capture_output=True, text=True, cwd=tmp_path, env=base, timeout=120
    )


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: p.stem)
def test_first_two_cells_run_offline_where_the_kit_is_installed(path, tmp_path):
    cells = code_cells(path)
    assert [c["metadata"].get("tags") for c in cells[:2]] == [["install"], ["parameters"]], (
        f"{path.name}: the first two code cells must be the install cell and the parameters cell"
    )
    kit = "import helpers, helpers.env  # what the cells after them start with"
    done = run_cells(["".join(c["source"]) for c in cells[:2]] + [kit], tmp_path)
    assert done.returncode == 0 and done.stdout.endswith("CELLS DONE\n"), done.stdout + done.stderr
    assert done.stdout == "CELLS DONE\n", f"the install cell printed where it should do nothing: {done.stdout}"


def test_the_offline_check_fails_when_the_cell_would_install(tmp_path):
    # the same run on a Python without the kit: the cell goes for pip, and the guard stops it
    done = run_cells([INSTALL_CELL], tmp_path, kit_visible=False)
    assert done.returncode != 0 and "GUARD: the cell reached for the network or started a program" in done.stderr


def joins(done: subprocess.CompletedProcess) -> list[tuple[float | None, bool]]:
    """(bound, still running when the join returned) for each Thread.join the cells made (prelude JOINS)."""
    found = re.findall(r"^JOIN .* timeout=(\S+) alive=(True|False)$", done.stdout, re.M)
    return [(None if bound == "None" else float(bound), alive == "True") for bound, alive in found]


def test_kaggle_without_internet_says_how_to_switch_it_on_at_once(tmp_path):
    done = run_cells(
        [INSTALL_CELL],
        tmp_path,
        prelude=GUARD + OFFLINE + JOINS,
        kit_visible=False,
        env={"KAGGLE_KERNEL_RUN_TYPE": "Interactive"},
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "RuntimeError: This Kaggle session has no internet. Open Settings > Internet, switch it On "
        "(it needs a phone-verified account), then run this cell again."
    ), done.stderr
    assert "GUARD" not in done.stderr, "pip must not run when the probe already failed"
    # at once: the probe's one thread had ended (its connection refused) when the cell stopped
    # waiting for it, so the cell decided on the probe's answer, not by waiting out its bound
    assert [still_running for _, still_running in joins(done)] == [False], done.stdout


@background(timed=True)
def kaggle_lookup_hangs(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The install cell on Kaggle where the name lookup never answers: it waits out its probe's bound (10 s)."""
    hangs = "import socket, time\nsocket.create_connection = lambda *a, **k: time.sleep(3600)\n"
    return run_cells(  # timeout=120 in run_cells: a probe that waited for the lookup fails the test there
        [INSTALL_CELL],
        folder,
        prelude=GUARD + hangs + JOINS,
        kit_visible=False,
        env={"KAGGLE_KERNEL_RUN_TYPE": "Batch"},
        session=env,
    )


def test_kaggle_with_a_name_lookup_that_never_answers_says_so_within_the_probes_bound(kaggle_lookup_hangs):
    done = kaggle_lookup_hangs
    assert done.returncode != 0 and "This Kaggle session has no internet" in done.stderr, done.stderr
    assert "GUARD" not in done.stderr, "pip must not run when the probe already failed"
    # an order, not a duration: the cell gave up on the probe while the lookup was still hanging,
    # after the one wait it allows itself (10 s), however long the lookup would take
    ((bound, still_hanging),) = joins(done)
    assert still_hanging and bound is not None and bound <= 10, "the probe is bounded at 10 s however the lookup hangs"


def fake_torch(folder: Path, version: str) -> Path:
    """A site folder where importlib.metadata finds torch `version` (a dist-info, no code)."""
    info = folder / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return folder


@pytest.mark.parametrize("torch_version", ["2.6.0+cu124", None], ids=["colab-torch", "no-torch"])
def test_pip_gets_the_pins_and_the_runtimes_torch_and_a_failure_is_explained(tmp_path, torch_version):
    site = (str(fake_torch(tmp_path / "site", torch_version)),) if torch_version else ()
    done = run_cells([INSTALL_CELL], tmp_path, prelude=GUARD + RECORD_PIP, kit_visible=False, sys_path=site)
    (line,) = [text for text in done.stdout.splitlines() if text.startswith("PIP ")]
    pip = json.loads(line[4:])
    args = pip["args"]
    assert args[:3] == ["-m", "pip", "install"] and args[-1] == KIT_URL
    assert args[args.index("-c") + 1] == PINS_URL
    assert not any("torch" in a for a in args), "torch is only ever a constraint, never a requirement"
    assert pip["runtime_pins"] == (f"torch=={torch_version}\n" if torch_version else "")
    assert "The conflict is caused by: ...\nERROR: ResolutionImpossible" in done.stdout, "pip's own words are shown"
    assert done.stderr.strip().splitlines()[-1] == (
        "RuntimeError: Installing the kit failed: pip says why just above. Fix that, then run this cell again."
    )
    assert "During handling of the above exception" not in done.stderr, "one error, not a chain of three"


# --- the restart check: real pip, real importlib.metadata, in a throwaway venv ----------------------
# Two libraries the "runtime" has at 1.0: the session has imported `loadedlib` (as a fresh Colab
# kernel has psutil), not `unloadedlib`. The fake kit needs both, `loadedlib` only at a floor.
FAKE_KIT_REQUIRES = ("loadedlib>=1.0", "unloadedlib")

# What the fake kit carries of the real one: the module the cell runs after pip (helpers.install) with
# the one it imports (helpers._requirements), and the file the cell's guard knows the kit's `helpers` by
# (helpers/env.py; empty here)
KIT_MODULES = {
    "helpers/__init__.py": "",
    "helpers/env.py": "",
    "helpers/install.py": (REPO_ROOT / "helpers" / "install.py").read_text(),
    "helpers/_requirements.py": (REPO_ROOT / "helpers" / "_requirements.py").read_text(),
}

# Runs first in the venv's Python: the cell's own pip command, with GitHub's two URLs pointed at
# local files (a stand-in requirements.txt and the fake kit's wheel) and PyPI at a folder of wheels.
LOCAL_GITHUB = """
import subprocess, sys

real_run, local, wheels = subprocess.run, {local!r}, {wheels!r}

def pip_offline(args, *a, **kw):
    assert list(args[:4]) == [sys.executable, "-m", "pip", "install"], args
    assert set(local) <= set(args), f"the cell no longer names {{set(local) - set(args)}}"
    return real_run([local.get(x, x) for x in args] + ["--no-index", "--find-links", wheels], *a, **kw)

subprocess.run = pip_offline
"""


def write_wheel(
    folder: Path, name: str, version: str, requires: tuple[str, ...] = (), modules: dict[str, str] | None = None
) -> Path:
    """A real wheel that pip installs offline: module `name` (with VERSION), `modules` {path: text}, its metadata."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        **(modules or {}),
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = {
        k: base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b"=").decode() for k, v in files.items()
    }
    files[f"{info}/RECORD"] = "".join(f"{k},sha256={digest[k]},{len(v.encode())}\n" for k, v in files.items())
    files[f"{info}/RECORD"] += f"{info}/RECORD,,\n"
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for k, v in files.items():
            whl.writestr(k, v)
    return path


@background(seconds=4)
def runtime_template(root: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """A venv with pip and loadedlib 1.0 and unloadedlib 1.0; a folder of wheels with their 2.0 and the kit."""
    wheels = root / "wheels"
    wheels.mkdir()
    for lib in ("loadedlib", "unloadedlib"):
        for version in ("1.0", "2.0"):
            write_wheel(wheels, lib, version)
    kit = write_wheel(wheels, DISTRIBUTION, "0.1.0", FAKE_KIT_REQUIRES, KIT_MODULES)
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120, env=env)
    python = root / "venv" / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
    subprocess.run([*pip, "loadedlib==1.0", "unloadedlib==1.0"], check=True, timeout=120, env=env)
    return root, kit


def runtime(template, tmp_path: Path, pins: str) -> tuple[str, str]:
    """A copy of the template venv and the prelude that points the cell's pip at `pins` and the wheels."""
    (root, kit), venv = template, tmp_path / "venv"
    shutil.copytree(root / "venv", venv, symlinks=True)
    (tmp_path / "requirements.txt").write_text(pins)
    local = {PINS_URL: str(tmp_path / "requirements.txt"), KIT_URL: str(kit)}
    return str(venv / "bin" / "python"), LOCAL_GITHUB.format(local=local, wheels=str(root / "wheels"))


RESTART = (
    "RuntimeError: Restart the session, then run the notebook from the top (this cell will skip the install). "
    "Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs."
)


def test_pip_replacing_an_imported_library_stops_the_notebook_with_the_menu_to_click(runtime_template, tmp_path):
    # the old requirements.txt pinned what the runtime owns exactly (psutil==7.2.2): pip replaces it
    python, prelude = runtime(runtime_template, tmp_path, "loadedlib==2.0\nunloadedlib==2.0\n")
    done = run_cells(["import loadedlib", INSTALL_CELL], tmp_path, prelude=prelude, python=python)
    assert done.returncode != 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-2:] == [
        "Installed, but pip replaced libraries this session had already imported:",
        "  loadedlib 1.0 -> 2.0",
    ], done.stdout + done.stderr  # unloadedlib was replaced too, but nothing had loaded it
    assert done.stderr.strip().splitlines()[-1] == RESTART, done.stderr
    # after the restart: a fresh process, the same venv; the cell does nothing, the new version loads
    again = run_cells([INSTALL_CELL, "import loadedlib; print(loadedlib.VERSION)"], tmp_path, python=python)
    assert again.stdout == "2.0\nCELLS DONE\n", again.stdout + again.stderr


def test_a_floor_keeps_the_runtimes_imported_library_and_no_restart_is_asked(runtime_template, tmp_path):
    # requirements.txt pins only what the course needs exact; loadedlib has a floor the runtime meets
    python, prelude = runtime(runtime_template, tmp_path, "unloadedlib==2.0\n")
    done = run_cells(
        ["import loadedlib", INSTALL_CELL, "import unloadedlib; print(loadedlib.VERSION, unloadedlib.VERSION)"],
        tmp_path,
        prelude=prelude,
        python=python,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-3:] == ["Installed.", "1.0 2.0", "CELLS DONE"], done.stdout


def test_the_cell_names_the_distribution_pyproject_builds():
    from importlib.metadata import metadata

    assert metadata(DISTRIBUTION)["Name"] == DISTRIBUTION
    assert f'metadata.distributions(name="{DISTRIBUTION}")' in INSTALL_CELL


def index_reachable(timeout: float = 3.0) -> bool:
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


@background(seconds=20)
def install_dry_run(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess | None:
    """The cell itself, in a fresh venv that holds torch and a runtime's older psutil (which a fresh Colab kernel
    has imported); pip in --dry-run mode (about 20 s). None where the package index is out of reach."""
    if not index_reachable():
        return None
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "measure_install.py"), "--json", "--runtime-has", "psutil==5.9.5"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env=env,
    )


@pytest.mark.slow
def test_on_a_runtime_with_torch_and_psutil_the_cell_keeps_both_and_installs_no_cuda_wheel(install_dry_run):
    if install_dry_run is None:
        pytest.skip("the package index is out of reach: pip cannot resolve the install cell's requirements")
    done = install_dry_run
    assert done.returncode in (0, 1), done.stdout + done.stderr
    m = json.loads(done.stdout)
    assert m["forbidden"] == [], f"the install cell would bring {m['forbidden']}"
    got = {canonical_name(p["name"]): p["version"] for p in m["packages"]}
    pins = {name: version for name, (version, _) in read_pins(REPO_ROOT / "requirements.txt").items()}
    for lib in ("transformers", "peft", "bitsandbytes", "datasets", "accelerate"):
        assert got.get(lib) == pins[lib], f"{lib}: the cell installs {got.get(lib)}, requirements.txt pins {pins[lib]}"
    assert "torch" not in got and m["torch"].startswith(("2.", "3."))
    assert "psutil" not in got and not any(r.startswith("psutil ") for r in m["replaces"]), (
        f"the cell would replace the runtime's psutil 5.9.5 (imported by a fresh Colab kernel): {m['replaces']}"
    )
