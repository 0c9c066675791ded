"""What a package is expected to have: a version, a complete help, its own name in usage, a license, a build floor."""

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import helpers

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def helpers_cli(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True, timeout=120)


def test_version_is_the_projects():
    done = helpers_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"python -m helpers {PYPROJECT['project']['version']}"
    assert helpers.__version__ == PYPROJECT["project"]["version"]


def test_top_level_help_lists_every_command_quickcheck_and_export_included():
    done = helpers_cli("--help")
    assert done.returncode == 0, done.stderr
    commands = done.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert set(commands) >= {"run", "plan", "gpu-proof", "publish", "export", "badges", "notebooks", "quickcheck"}
    assert "quickcheck          instructors:" in done.stdout


def test_the_course_kit_script_says_its_own_name():
    """pip's console script sets argv[0] to its path: usage must read `course-kit`, not `python -m helpers`."""
    assert PYPROJECT["project"]["scripts"]["course-kit"] == "helpers.__main__:main"
    fake_script = "import sys; sys.argv[0] = '/somewhere/bin/course-kit'; from helpers.__main__ import main; main()"
    done = subprocess.run([sys.executable, "-c", fake_script, "plan"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage: course-kit plan "), done.stderr
    installed = Path(sys.executable).with_name("course-kit")
    if installed.exists():  # the kit installed into this environment: the real script too
        done = subprocess.run([installed, "--version"], capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == f"course-kit {helpers.__version__}", done.stderr


def test_the_license_file_is_the_license_pyproject_declares():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "http://www.apache.org/licenses/LICENSE-2.0" in text
    assert len(text.splitlines()) == 201  # the full text, not a summary


def test_the_build_floor_reads_the_spdx_license_string():
    """setuptools before 77 refuses `license = "Apache-2.0"` (a string, PEP 639): the floor must be 77 or later."""
    (requirement,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    floor = min(Version(s.version) for s in requirement.specifier if s.operator in (">=", "=="))
    assert floor >= Version("77"), f"setuptools{requirement.specifier} cannot build a SPDX license string"
    try:
        installed = Version(metadata.version("setuptools"))
    except metadata.PackageNotFoundError:
        pytest.skip("setuptools is not installed here")
    if installed not in requirement.specifier:
        # Colab's and Kaggle's setuptools is 75.2: pip builds the kit in an isolated environment with
        # a setuptools of its own, which the runtime matrix (noxfile.py) proves by installing it there
        assert os.environ.get("KIT_RUNTIME"), f"this environment's setuptools {installed} is below the floor"
        assert metadata.version("compute-realities-kit"), "the install cell built the kit all the same"


# ---------------------------------------------------------------------------------------------
# a student's own helpers.py (Colab's /content, Kaggle's /kaggle/working) hiding the kit


def shadow_guards():
    """notebook stem -> the guard its install cell runs before any cell imports `helpers`, from the built notebook."""
    import json

    guards = {}
    for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        code = ["".join(c["source"]) for c in cells]
        first = next(i for i, c in enumerate(code) if re.search(r"^(from|import) helpers\b", c, re.M))
        install = next(i for i, c in enumerate(cells) if "install" in c["metadata"].get("tags", ()))
        assert install < first, f"{path.name}: the install cell (and its guard) comes after the first kit import"
        cell = code[install]
        start = cell.index("# A helpers.py")
        guard = cell[start : cell.index("\n    )\n", start) + 7]  # the guard up to the end of its raise
        assert 'find_spec("helpers")' in guard, f"{path.name}: no guard in the install cell"
        assert cell.index(guard) < cell.index("metadata.distributions("), "the guard runs before the install"
        guards[path.stem] = "import importlib.util\nimport os\n\n" + guard
    return guards


def run_guard(cwd):
    guard = shadow_guards()["01_memory_anatomy"]
    return subprocess.run([sys.executable, "-c", guard], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_every_notebook_guards_against_a_shadowing_helpers_with_the_same_text():
    guards = shadow_guards()
    assert len(guards) == 9 and len(set(guards.values())) == 1, sorted(guards)


def test_the_guard_names_a_students_helpers_py_and_the_rename(tmp_path):
    (tmp_path / "helpers.py").write_text("def plot(): pass\n")
    done = run_guard(tmp_path)
    assert done.returncode == 1
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith(f"RuntimeError: {tmp_path / 'helpers.py'} hides the course kit's `helpers` package.")
    assert f"Rename it to {tmp_path / 'my_helpers.py'}" in message and "Runtime > Restart session" in message


def test_the_guard_names_a_helpers_folder_without_the_kit(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    done = run_guard(tmp_path)
    assert f"RuntimeError: {tmp_path / 'helpers'} hides" in done.stderr
    assert f"Rename it to {tmp_path / 'my_helpers'} " in done.stderr


def test_the_guard_is_silent_without_a_shadow(tmp_path):
    done = run_guard(tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
