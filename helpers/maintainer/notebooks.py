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
from string import Template

__all__ = [
    "BRANCH",
    "DISTRIBUTION",
    "INSTALL_CELL",
    "INSTALL_TEMPLATE",
    "METADATA",
    "NOTEBOOKS_DIR",
    "REPOSITORY",
    "REPO_ROOT",
    "SOURCES_DIR",
    "build",
    "install_cell",
    "notebook_path",
    "problems",
    "render",
    "sources",
    "sync",
    "with_install_cell",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
SOURCES_DIR = NOTEBOOKS_DIR / "src"

# Where students open the notebooks and install the kit from: a GitHub repository and a git ref (a
# branch, or a tag that freezes a term's copy). The badges, the install cells and the README links
# all come from these two lines; `python -m helpers publish --repo OWNER/NAME --ref REF` rewrites
# them and rebuilds everything that names them (helpers/maintainer/publish.py).
REPOSITORY = "compute-realities/finetune-kit"
BRANCH = "main"

# The distribution pyproject.toml names: the install cell does nothing where it is installed already.
DISTRIBUTION = "compute-realities-kit"

# The same text in every notebook (a test checks), folded under its title in Colab and JupyterLab.
# What it does, in order:
# 0. a `helpers` of the student's own (a helpers.py or helpers/ beside the notebook) that would hide
#    the kit's is named with the rename that fixes it, before anything imports `helpers`;
# 1. nothing at all where the kit is installed (a local clone after `make`, or the cell's second run,
#    which is also the run after the restart of step 5); it asks for the distribution rather than
#    for `import helpers`, a name another package may own;
# 2. on Kaggle, whose internet can be switched off, a 5-second probe, so the student reads how to
#    switch it on instead of pip's retries and a connection traceback;
# 3. pip with two constraints files: requirements.txt at the same ref (the exact pins of what the
#    course teaches; pyproject.toml gives only floors for what the runtime owns, such as psutil, so
#    pip keeps the runtime's copy) and the runtime's own torch version, so pip can never replace
#    torch (a new torch build costs minutes and breaks CUDA, torchvision and the runtime); the kit
#    itself comes from the same ref as the notebook, so helpers and notebook always match;
# 4. pip's output only when it fails (its conflict report included), so a good install reads as two
#    lines, not a screen of "Collecting ..." and resolver warnings about other preinstalled packages;
# 4b. helpers.install.keep_runtime_working: the runtime's other libraries whose requirements pip
#    broke (Colab's gradio and diffusers refuse huggingface-hub 2) get versions that serve them and
#    the kit, and a library refused at run time (torchao < 0.16 by peft) is upgraded; the cell
#    prints what changed and what stays broken, with the command that restores it;
# 5. the versions of every library the session has already imported (its top-level module is in
#    sys.modules), before and after pip: where pip replaced one, the session would go on with the
#    old code half-mixed with the new, so the cell lists them and stops "Run all" with the menu to
#    click. Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs (the label
#    in Kaggle's editor, which public Kaggle guides give for the same case; Kaggle's docs do not
#    name the menu); not Factory reset, which would also undo the install.
# scripts/measure_install.py runs this very text against a local checkout and a venv that holds
# torch, and reports what pip would download and which of the runtime's libraries it would replace.
# $DISTRIBUTION, $REPOSITORY and $REF are filled in by install_cell().
INSTALL_TEMPLATE = r"""# @title Install the kit (about a minute; nothing to do where it is installed)
# Installs the kit and its pinned libraries. The runtime's own torch is kept, and nothing happens
# where the kit is installed already (a clone set up with `make`, or a second run).
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import threading

# A helpers.py or helpers/ folder of yours would hide the kit's `helpers`: name it before anything imports it.
found = importlib.util.find_spec("helpers")
folders = list(found.submodule_search_locations or []) if found else []
if found and not any(os.path.exists(os.path.join(folder, "env.py")) for folder in folders):
    shadow = folders[0] if folders else found.origin  # your helpers/ folder, or your helpers.py
    renamed = os.path.join(os.path.dirname(shadow), "my_" + os.path.basename(shadow))
    raise RuntimeError(
        f"{shadow} hides the course kit's `helpers` package. Rename it to {renamed} (any other name works), "
        "then restart the session (Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs)."
    )

if not any(metadata.distributions(name="$DISTRIBUTION")):
    repo, ref = "$REPOSITORY", "$REF"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:  # Kaggle's internet may be off: say so now, not after pip's retries
        reached = []  # the name lookup has no timeout of its own: the probe gets 10 s in all, in a thread

        def probe():
            try:
                socket.create_connection(("github.com", 443), timeout=5).close()
                reached.append(True)
            except OSError:
                pass

        probing = threading.Thread(target=probe, daemon=True)
        probing.start()
        probing.join(10)
        if not reached:
            raise RuntimeError(
                "This Kaggle session has no internet. Open Settings > Internet, switch it On "
                "(it needs a phone-verified account), then run this cell again."
            )
    runtime_pins = os.path.join(tempfile.mkdtemp(), "runtime-pins.txt")  # pip may not replace the runtime's torch
    with open(runtime_pins, "w") as f:
        f.writelines(f"torch=={d.version}\n" for d in metadata.distributions(name="torch"))
    pins = f"https://raw.githubusercontent.com/{repo}/{ref}/requirements.txt"
    pip = [sys.executable, "-m", "pip", "install", "--retries", "1", "-c", pins, "-c", runtime_pins]
    pip.append(f"git+https://github.com/{repo}.git@{ref}")

    def imported():  # name -> version of each library this session has imported (a fresh Colab has psutil)
        found = metadata.packages_distributions().items()
        names = {d for module, ds in found if module in sys.modules for d in ds if d}
        return {name: metadata.version(name) for name in sorted(names)}

    before = imported()
    every = {d.metadata["Name"]: d.version for d in metadata.distributions()}  # to mend what pip breaks
    print(f"Installing the kit from github.com/{repo} at {ref} ...")
    done = subprocess.run(pip, capture_output=True, text=True)  # pip's output only if it fails
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise RuntimeError("Installing the kit failed: pip says why just above. Fix that, then run this cell again.")
    importlib.invalidate_caches()  # the kit's files are new since this session started
    from helpers.install import keep_runtime_working

    keep_runtime_working(every, pip[:-1])  # the runtime's other libraries pip broke: mended, or named
    after = imported()
    replaced = [f"{name} {old} -> {after.get(name, 'gone')}" for name, old in before.items() if after.get(name) != old]
    if replaced:  # the session holds their old code: only a restart loads the new versions
        print("Installed, but pip replaced libraries this session had already imported:", *replaced, sep="\n  ")
        raise RuntimeError(
            "Restart the session, then run the notebook from the top (this cell will skip the install). "
            "Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs."
        )
    print("Installed.")"""


def install_cell(repository: str = REPOSITORY, ref: str = BRANCH) -> str:
    """The install cell's text for students who open the notebooks from `repository` at `ref`."""
    return Template(INSTALL_TEMPLATE).substitute(DISTRIBUTION=DISTRIBUTION, REPOSITORY=repository, REF=ref)


INSTALL_CELL = install_cell()

# The install cell, and a cell tagged "record" (it saves the run's figures for the tests with
# helpers.record): machinery, not lesson, so their source starts folded (JupyterLab:
# jupyter.source_hidden; Colab: a form, which shows the install cell's "# @title" line).
HIDDEN = {"jupyter": {"source_hidden": True}, "cellView": "form"}
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


def with_install_cell(text: str, cell: str = INSTALL_CELL) -> str:
    """Return a py:percent source whose install cell holds exactly `cell` (default: INSTALL_CELL)."""
    start = text.find(INSTALL_MARKER)
    if start < 0:
        raise ValueError(f"no install cell: add a cell starting with {INSTALL_MARKER} after the title cell")
    body = start + len(INSTALL_MARKER) + 1
    nxt = re.compile(r"^# %%", re.M).search(text, body)
    end = nxt.start() if nxt else len(text)
    return text[:body] + cell + ("\n\n" if nxt else "\n") + text[end:]


def build(source: Path, cell: str = INSTALL_CELL):
    """Build the stripped notebook for one source, with `cell` as its install cell, deterministically."""
    import jupytext
    import nbformat

    nb = jupytext.reads(with_install_cell(source.read_text(), cell), fmt="py:percent")
    nb.metadata = copy.deepcopy(METADATA)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{source.stem[:2]}-{i:02d}"  # stable ids: a rebuild changes nothing
        tags = cell.metadata.get("tags")
        cell.metadata = {"tags": tags} if tags else {}
        if {"install", "record"} & set(tags or ()):  # the kit's own machinery: folded in JupyterLab and Colab
            cell.metadata.update(HIDDEN)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.validate(nb)
    return nb


def render(source: Path, cell: str = INSTALL_CELL) -> str:
    import nbformat

    return nbformat.writes(build(source, cell)) + "\n"


def sync(folder: Path = SOURCES_DIR, cell: str = INSTALL_CELL) -> list[Path]:
    """Rewrite install cells (to `cell`) in the sources and every notebook that differs; return what changed."""
    changed = []
    for source in sources(folder):
        text = source.read_text()
        if with_install_cell(text, cell) != text:
            source.write_text(with_install_cell(text, cell))
            changed.append(source)
        target, wanted = notebook_path(source), render(source, cell)
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
            found.append(
                f"{source}: the install cell differs from helpers.maintainer.notebooks.INSTALL_CELL; "
                f"run `{SYNC_COMMAND}`"
            )
        if not target.exists():
            found.append(f"{target} is missing; run `{SYNC_COMMAND}`")
        elif target.read_text() != render(source):
            found.append(f"{target} differs from {source} (edited by hand, or not rebuilt); run `{SYNC_COMMAND}`")
    return found
