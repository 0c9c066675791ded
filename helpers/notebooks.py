"""The notebooks as text: build `notebooks/NN_name.ipynb` from `notebooks/src/NN_name.py`.

The py:percent sources are what people edit and review; `make notebooks` (this module's
`sync()`) writes the .ipynb files students open, stripped of outputs, with the metadata that
asks Colab for a T4 and Kaggle for a GPU, and with the one install cell below. The tests call
`problems()` and fail with its messages when a notebook drifts from its source.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
SOURCES_DIR = NOTEBOOKS_DIR / "src"

# Where students install the kit from; forks change these two lines and nothing else.
REPOSITORY = "compute-realities/finetune-kit"
BRANCH = "main"

# The same text in every notebook (a test checks). It never installs torch: Colab and Kaggle
# ship their own build, and replacing it costs minutes and can break the runtime.
INSTALL_CELL = f"""\
# Install the kit and its pinned libraries (about a minute; the runtime's own torch is kept).
import importlib.util, os, subprocess, sys

if importlib.util.find_spec("helpers") is None:
    repo, branch = "{REPOSITORY}", "{BRANCH}"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--retries", "1",
           "-c", f"https://raw.githubusercontent.com/{{repo}}/{{branch}}/requirements.txt",
           f"git+https://github.com/{{repo}}.git@{{branch}}"]
    if subprocess.run(pip).returncode != 0:
        fix = ("Kaggle: open Settings > Internet, switch it On, then run this cell again."
               if "KAGGLE_KERNEL_RUN_TYPE" in os.environ else "Check the connection and run this cell again.")
        raise RuntimeError("Installing the kit failed (pip printed why above). " + fix)"""

INSTALL_MARKER = '# %% tags=["install"]'
SYNC_COMMAND = "make notebooks"

# Colab: open on a GPU runtime with a T4. Kaggle: ask for an accelerator and internet.
METADATA = {
    "accelerator": "GPU",
    "colab": {"gpuType": "T4", "provenance": []},
    "kaggle": {"accelerator": "nvidiaTeslaT4", "isGpuEnabled": True, "isInternetEnabled": True},
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def sources(folder: Path = SOURCES_DIR) -> list[Path]:
    """The notebook sources, in course order."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def notebook_path(source: Path) -> Path:
    return source.parent.parent / f"{source.stem}.ipynb"


def with_install_cell(text: str) -> str:
    """Return a py:percent source whose install cell holds exactly INSTALL_CELL."""
    start = text.find(INSTALL_MARKER)
    if start < 0:
        raise ValueError(f"no install cell: add a cell starting with {INSTALL_MARKER} after the title cell")
    body = start + len(INSTALL_MARKER) + 1
    nxt = re.compile(r"^# %%", re.M).search(text, body)
    end = nxt.start() if nxt else len(text)
    return text[:body] + INSTALL_CELL + ("\n\n" if nxt else "\n") + text[end:]


def build(source: Path):
    """Build the stripped notebook for one source, deterministically (same text, same bytes)."""
    import jupytext
    import nbformat

    nb = jupytext.reads(with_install_cell(source.read_text()), fmt="py:percent")
    nb.metadata = copy.deepcopy(METADATA)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{source.stem[:2]}-{i:02d}"  # stable ids: a rebuild changes nothing
        tags = cell.metadata.get("tags")
        cell.metadata = {"tags": tags} if tags else {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.validate(nb)
    return nb


def render(source: Path) -> str:
    import nbformat

    return nbformat.writes(build(source)) + "\n"


def sync(folder: Path = SOURCES_DIR) -> list[Path]:
    """Rewrite install cells in the sources and every notebook that differs; return what changed."""
    changed = []
    for source in sources(folder):
        text = source.read_text()
        if with_install_cell(text) != text:
            source.write_text(with_install_cell(text))
            changed.append(source)
        target, wanted = notebook_path(source), render(source)
        if not target.exists() or target.read_text() != wanted:
            target.write_text(wanted)
            changed.append(target)
    return changed


def problems(folder: Path = SOURCES_DIR) -> list[str]:
    """Every way the committed notebooks differ from their sources, each with the fix."""
    found = []
    srcs = sources(folder)
    stems = {s.stem for s in srcs}
    for nb in sorted(folder.parent.glob("*.ipynb")):
        if nb.stem not in stems:
            found.append(f"{nb} has no source {folder / (nb.stem + '.py')}: write it, or delete the notebook")
    for source in srcs:
        target = notebook_path(source)
        if with_install_cell(source.read_text()) != source.read_text():
            found.append(f"{source}: the install cell differs from helpers.notebooks.INSTALL_CELL; run `{SYNC_COMMAND}`")
        if not target.exists():
            found.append(f"{target} is missing; run `{SYNC_COMMAND}`")
        elif target.read_text() != render(source):
            found.append(f"{target} differs from {source} (edited by hand, or not rebuilt); run `{SYNC_COMMAND}`")
    return found
