"""The committed notebooks: in sync with notebooks/src, stripped, never installing torch.

Their shape (first cell, install cell, parameters, recap, ...): tests/test_notebook_shape.py.
"""

import ast
import json
import os
import re
import shutil
import tomllib
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from helpers._requirements import canonical_name, read_pins
from helpers.maintainer import notebooks
from helpers.maintainer.notebooks import INSTALL_CELL, METADATA, NOTEBOOKS_DIR, REPO_ROOT

DISTRIBUTION = "compute-realities-kit"  # pyproject.toml's name; its metadata lists the dependencies
IPYNBS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text())


def test_there_are_notebooks_and_each_has_a_source():
    assert IPYNBS, f"no notebooks in {NOTEBOOKS_DIR}"
    assert [p.stem for p in IPYNBS] == [s.stem for s in notebooks.sources()]


def test_notebooks_are_in_sync_with_their_sources():
    found = notebooks.problems()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: p.stem)
def test_notebook_is_stripped_and_asks_for_a_gpu(path):
    nb = load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), f"{path} has outputs"
    assert "widgets" not in nb["metadata"], f"{path} carries widget state"
    assert nb["metadata"] == METADATA


def pip_arguments(cell: str) -> list[str]:
    """The literal strings of the `pip = [...]` list in the install cell."""
    for node in ast.walk(ast.parse(cell)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "pip":
            return [ast.unparse(e) for e in node.value.elts]
    raise AssertionError("the install cell has no `pip = [...]` list")


def test_install_cell_never_installs_torch():
    args = pip_arguments(INSTALL_CELL)
    assert "'install'" in args and not any("torch" in a for a in args)
    assert "-c" in INSTALL_CELL, "requirements.txt constrains every library to its pin"
    pins = (REPO_ROOT / "requirements.txt").read_text()
    assert not re.search(r"^\s*torch", pins, re.M), "requirements.txt (the constraints file) must not pin torch"
    assert not any(d.startswith("torch") for d in requires(DISTRIBUTION))


def exact_pins(name: str) -> dict[str, str]:
    """{package: version} of the `==` lines of a requirements file, following `-r` includes."""
    return {package: version for package, (version, _) in read_pins(REPO_ROOT / name).items()}


def dependencies() -> list[Requirement]:
    """pyproject.toml's [project] dependencies, read from the file (the installed metadata may be older)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(d) for d in project["dependencies"]]


def test_students_get_exact_pins_only_for_what_the_course_teaches_and_floors_for_the_rest():
    students, tests = exact_pins("requirements.txt"), exact_pins("requirements-dev.txt")
    for dep in dependencies():
        name = canonical_name(dep.name)
        if dep.specifier:  # a floor: pip keeps the runtime's copy when it meets it
            assert all(s.operator == ">=" for s in dep.specifier), f"{dep}: a dependency gets a floor (>=) or nothing"
            assert name not in students, (
                f"{name} has a floor in pyproject.toml, so requirements.txt must not force its version on students"
            )
            assert name in tests and tests[name] in dep.specifier, (
                f"pin {name} exactly in requirements-dev.txt, at a version that meets {dep.specifier}, for the tests"
            )
        else:  # what the course teaches: the install cell's constraints pin it
            assert name in students, f"add an exact pin for {name} to requirements.txt, or give it a floor here"
    taught = {canonical_name(d.name) for d in dependencies() if not d.specifier}
    extra = sorted(set(students) - taught)
    assert not extra, f"requirements.txt forces {extra}: pin only what pyproject.toml lists without a floor"
    assert "psutil" not in students, "a fresh Colab kernel has psutil imported: replacing it forces a restart"


def test_every_exact_pin_says_why():
    pins = read_pins(REPO_ROOT / "requirements.txt", reasons=True)  # a ValueError names a pin without its reason
    assert pins and all(reason for _, reason in pins.values())


def test_test_tools_stay_out_of_what_students_install_and_the_tests_get_every_pin():
    students = exact_pins("requirements.txt")
    dev = (REPO_ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^-r requirements\.txt$", dev, re.M), "requirements-dev.txt includes requirements.txt"
    for tool in ("pytest", "nbval", "papermill", "ruff", "jupytext", "ipykernel", "nbstripout"):
        assert tool not in students and tool in exact_pins("requirements-dev.txt"), tool
    dev = exact_pins("requirements-dev.txt")
    runtime = os.environ.get("KIT_RUNTIME")  # set by the runtime matrix (noxfile.py): Colab's or Kaggle's libraries
    if not runtime:
        installed = {name: version(name) for name in dev}
        assert installed == dev, "run `make setup`: the tests run against the exact pins"
        return
    # nox drives the matrix from the kit's own venv: the runtime does not get it
    installed = {name: version(name) for name in dev if name != "nox"}
    # there each library is the kit's pin (the install cell forced it) or the runtime's own (kept), never a third
    kept = exact_pins(f"tests/runtimes/{runtime}.txt")
    drifted = {n: v for n, v in installed.items() if v not in (dev[n], kept.get(n))}
    assert not drifted, f"neither the kit's pin nor {runtime}'s version: {drifted}"


@pytest.fixture
def scratch(tmp_path):
    """A copy of the first notebook and its source, to edit."""
    src = tmp_path / "src"
    src.mkdir()
    source = shutil.copy(notebooks.sources()[0], src)
    shutil.copy(IPYNBS[0], tmp_path)
    return Path(source)


def test_edited_source_is_reported_with_the_command_that_fixes_it(scratch):
    assert notebooks.problems(scratch.parent) == []
    scratch.write_text(scratch.read_text() + "\n# %%\nprint('a new cell')\n")
    (problem,) = notebooks.problems(scratch.parent)
    assert "differs from" in problem and "make notebooks" in problem
    assert notebooks.sync(scratch.parent) == [notebooks.notebook_path(scratch)]
    assert notebooks.problems(scratch.parent) == []


def test_hand_edited_install_cell_is_restored(scratch):
    scratch.write_text(scratch.read_text().replace("--retries", "--no-deps"))
    assert any("install cell differs" in p for p in notebooks.problems(scratch.parent))
    notebooks.sync(scratch.parent)
    assert INSTALL_CELL in scratch.read_text() and notebooks.problems(scratch.parent) == []


def test_notebook_without_a_source_is_reported(scratch):
    shutil.copy(IPYNBS[0], scratch.parent.parent / "99_orphan.ipynb")
    (problem,) = notebooks.problems(scratch.parent)
    assert "99_orphan.ipynb has no source" in problem


def test_source_without_install_cell_says_how_to_add_one(scratch):
    scratch.write_text(scratch.read_text().replace('# %% tags=["install"]', "# %%"))
    with pytest.raises(ValueError, match=r'no install cell: add a cell starting with # %% tags=\["install"\]'):
        notebooks.problems(scratch.parent)
