"""The committed notebooks: in sync with notebooks/src, stripped, one install cell, never torch."""

import ast
import json
import re
import shutil
from importlib.metadata import requires
from pathlib import Path

import pytest

from helpers.maintainer import notebooks
from helpers.maintainer.notebooks import INSTALL_CELL, METADATA, NOTEBOOKS_DIR, REPO_ROOT

DISTRIBUTION = "compute-realities-kit"  # pyproject.toml's name; its metadata lists the dependencies
IPYNBS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text())


def tagged(nb, tag):
    return [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]


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


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: p.stem)
def test_notebook_shape(path):
    nb = load(path)
    first = "".join(nb["cells"][0]["source"])
    assert nb["cells"][0]["cell_type"] == "markdown"
    assert "**Hardware:**" in first and "**Time:**" in first, "the first cell states hardware and run time"
    (install,) = tagged(nb, "install")
    assert "".join(install["source"]) == INSTALL_CELL
    assert nb["cells"].index(install) == 1, "the install cell comes right after the title"
    (params,) = tagged(nb, "parameters")
    declared = ast.parse("".join(params["source"]))
    names = {t.id for node in declared.body for t in getattr(node, "targets", [])}
    assert "smoke" in names, "every notebook can be switched to the embedded model"
    assert "In this notebook we:" in "".join(nb["cells"][-1]["source"]), "a recap ends the notebook"
    assert sum("helpers.record(" in "".join(c["source"]) for c in nb["cells"]) >= 1


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


def test_every_dependency_is_pinned_exactly():
    deps = requires(DISTRIBUTION)
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO_ROOT / "requirements.txt").read_text(), re.M))
    unpinned = [d for d in deps if d not in pins]
    assert not unpinned, f"add exact pins to requirements.txt for {unpinned}"


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
