"""The install cell: silent and offline where the kit is installed, clear on Kaggle without internet,
never torch, and what it would download on a runtime that already has torch.

The cell runs here in a plain Python process, the way the first cells of a notebook run in a
kernel, with the network and every subprocess replaced by a guard that fails the run: a cell that
tried pip or a connection could not pass by accident.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.maintainer.notebooks import BRANCH, DISTRIBUTION, INSTALL_CELL, NOTEBOOKS_DIR, REPO_ROOT, REPOSITORY

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
) -> subprocess.CompletedProcess:
    """Run `cells` in order in a fresh Python, after `prelude`; `kit_visible=False` hides site-packages."""
    script = tmp_path / "cells.py"
    body = "".join(f"exec(compile({c!r}, 'cell {i}', 'exec'))\n" for i, c in enumerate(cells))
    script.write_text(f"import sys\nsys.path[:0] = {list(sys_path)!r}\n{prelude}\n{body}print('CELLS DONE')\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KAGGLE_", "COLAB_"))}
    base.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, **(env or {}))
    flags = [] if kit_visible else ["-S", "-s"]  # -S: no site-packages, so neither the kit nor torch
    # cwd is a scratch folder: `helpers` must come from the installed kit, not from the checkout
    return subprocess.run(
        [sys.executable, *flags, str(script)], capture_output=True, text=True, cwd=tmp_path, env=base, timeout=120
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


def test_kaggle_without_internet_says_how_to_switch_it_on_at_once(tmp_path):
    start = time.perf_counter()
    done = run_cells(
        [INSTALL_CELL],
        tmp_path,
        prelude=GUARD + OFFLINE,
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
    assert time.perf_counter() - start < 10


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


def test_on_a_runtime_with_torch_the_cell_installs_no_torch_and_no_cuda_wheel():
    # the cell itself, in a fresh venv that holds torch; pip in --dry-run mode (about 15 s)
    if not index_reachable():
        pytest.skip("the package index is out of reach: pip cannot resolve the install cell's requirements")
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "measure_install.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    m = json.loads(done.stdout)
    assert m["forbidden"] == [], f"the install cell would bring {m['forbidden']}"
    got = {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in m["packages"]}
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO_ROOT / "requirements.txt").read_text(), re.M))
    for lib in ("transformers", "peft", "bitsandbytes", "datasets", "accelerate"):
        assert got.get(lib) == pins[lib], f"{lib}: the cell installs {got.get(lib)}, requirements.txt pins {pins[lib]}"
    assert "torch" not in got and m["torch"].startswith(("2.", "3."))
