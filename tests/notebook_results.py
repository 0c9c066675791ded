"""What the notebook tests share: the notebooks' cells, an executed copy's printed text, a run's figures.

Imported by tests/test_notebook_shape.py (the rules every notebook follows) and by the one test file
per notebook that checks its claims (tests/test_<technique>_notebook.py).
"""

import math
import re
import statistics

import nbformat

from helpers.maintainer.notebooks import NOTEBOOKS_DIR, SOURCES_DIR

STEMS = tuple(p.stem for p in sorted(NOTEBOOKS_DIR.glob("*.ipynb")))


def notebook_cells(stem):
    """The committed notebook's cells (nbformat)."""
    return nbformat.read(NOTEBOOKS_DIR / f"{stem}.ipynb", as_version=4).cells


def source_cells(stem):
    """(kind, tags, text) per cell of a notebook source; markdown text without its '# ' prefixes."""
    parts = re.split(r"(?m)^# %%", (SOURCES_DIR / f"{stem}.py").read_text())[1:]
    out = []
    for part in parts:
        header, _, body = part.partition("\n")
        kind = "markdown" if "[markdown]" in header else "code"
        tags = re.findall(r'"(\w+)"', header)
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
        out.append((kind, tags, body))
    return out


def tagged(cell, tag):
    return tag in cell.metadata.get("tags", [])


def parameters(stem):
    """The values the notebook's parameters cell assigns, as papermill would run it."""
    (params,) = [c for c in notebook_cells(stem) if tagged(c, "parameters")]
    values = {}
    exec(params.source, {}, values)
    return values


def outputs_text(path):
    """Every stream and text output of an executed notebook, as one string."""
    nb = nbformat.read(path, as_version=4)
    return "\n".join(
        o.get("text", "") or o.get("data", {}).get("text/plain", "") for c in nb.cells for o in c.get("outputs", [])
    )


def figures_of(notebook_run, stems):
    """The figures each of `stems` recorded in the suite's smoke run on this CPU (tests/conftest.py)."""
    assert notebook_run.returncode == 0, notebook_run.printed[-5000:]
    summary = notebook_run.summary()
    for stem in stems:
        assert summary[stem]["status"] == "ok", summary[stem]["error"]
        print(f"{stem}: {summary[stem]['seconds']:.1f} s")  # the target is under 30 s each; not judged on shared CPUs
    return {stem: notebook_run.results[stem] for stem in stems}


def learned(r, steps, curve=True):
    """The fine-tune ran every step and lowered the loss of a fixed batch (and the training curve, if judged)."""
    losses = r["train_losses"]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    assert r["loss_after"] < r["loss_before"], "fine-tuning lowers the loss of the same fixed batch"
    if curve:  # each step's loss is on its own batch: judged on averages of five
        assert statistics.fmean(losses[-5:]) < statistics.fmean(losses[:5]), "the training curve falls"


def simulated_figures(simulated_runs) -> dict[str, dict]:
    """Every notebook's figures from the simulated run that ran it (tests/conftest.py, ONLY; 07's from T4 x2)."""
    merged = {}
    for run in simulated_runs.values():  # T4, then T4 x2
        merged |= run.results
    return merged
