"""`python -m helpers run`: execute the notebooks headless with papermill and report what they measured.

`make run` is this command; the tests run it with `--smoke`. For each notebook it writes
`<out>/notebooks/<stem>.ipynb` (the executed copy), `<out>/results/<stem>.json` (what the
notebook passed to `helpers.record`), then `<out>/summary.md` and `<out>/summary.json`.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.results import load_results

__all__ = ["Outcome", "UsageError", "declared_parameters", "execute", "format_line", "run", "select", "write_summary"]

# What --smoke injects, for the notebooks whose parameters cell declares them.
SMOKE_PARAMETERS = {"smoke": True, "max_steps": 4}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class UsageError(ValueError):
    """Bad command-line input; the message says what would work."""


@dataclass
class Outcome:
    notebook: str
    status: str  # "ok" or "failed"
    seconds: float
    results: dict = field(default_factory=dict)
    error: str = ""


def select(names: list[str] | None, folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebooks to run: all of them, or those named by stem or number prefix ("03")."""
    available = sorted(folder.glob("*.ipynb"))
    if not available:
        raise UsageError(f"no notebooks in {folder}: run from a clone of the repository, or pass --notebooks DIR")
    if not names:
        return available
    chosen = []
    for name in names:
        stem = Path(name).stem
        hits = [p for p in available if p.stem == stem] or [p for p in available if p.stem.startswith(stem)]
        if len(hits) != 1:
            what = "matches several notebooks" if hits else "is not a notebook"
            listing = "\n  ".join(p.stem for p in available)
            raise UsageError(f"--only {name!r} {what}. Pass a stem or its number, one of:\n  {listing}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def execute(path: Path, out: Path, *, smoke: bool) -> Outcome:
    """Execute one notebook with papermill; never raises for a failing cell."""
    import papermill as pm

    # papermill re-reads the parameters cell for its report and warns about every line whose
    # comment holds an "=", which the kit's style does on purpose; declared_parameters reads it
    logging.getLogger("papermill.translators").setLevel(logging.ERROR)
    stem = path.stem
    results_file = out / "results" / f"{stem}.json"
    results_file.unlink(missing_ok=True)  # figures from an earlier run must not pass as this run's
    workdir = out / "work" / stem
    workdir.mkdir(parents=True, exist_ok=True)
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    declared = declared_parameters(path)
    parameters = {"smoke": smoke} if "smoke" in declared else {}
    if smoke:
        parameters.update({k: v for k, v in SMOKE_PARAMETERS.items() if k in declared})
    # the kernel inherits these; record() reads them
    kernel_env = {"HELPERS_RESULTS_DIR": str(results_file.parent.resolve()), "HELPERS_NOTEBOOK": stem}
    start = time.perf_counter()
    error = ""
    with _environ(kernel_env):
        try:
            pm.execute_notebook(
                str(path),
                str(out / "notebooks" / f"{stem}.ipynb"),
                parameters=parameters,
                kernel_name="python3",
                cwd=str(workdir),
                progress_bar=False,
            )
        except pm.PapermillExecutionError as e:
            error = _describe_failure(path, e)
    seconds = time.perf_counter() - start
    return Outcome(stem, "failed" if error else "ok", seconds, load_results(results_file), error)


def declared_parameters(path: Path) -> set[str]:
    """Names the notebook's `parameters` cell assigns.

    Read with `ast` rather than papermill's line parser, which skips a line whose comment holds
    an "=" (`grad_accum_steps = 16  # effective batch = 1 x 16 x 1 = 16`, the kit's own style).
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if not cells:
        return set()
    tree = ast.parse(cells[0].source)
    return {
        t.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }


@contextmanager
def _environ(values: dict[str, str]):
    """Set environment variables for the duration of a block, then put the old ones back."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _describe_failure(path: Path, e) -> str:
    tb = ANSI.sub("", "\n".join(e.traceback[-8:]))
    source = "\n".join("    " + line for line in e.source.splitlines())
    return (
        f"{path.name}: cell {e.exec_count} failed with {e.ename}: {e.evalue}\n"
        f"  the cell:\n{source}\n  traceback (last lines):\n{tb}"
    )


def format_line(o: Outcome, max_figures: int = 5) -> str:
    """One line per notebook: status, seconds and its first recorded figures."""
    figures = "  ".join(f"{k}={_short(v)}" for k, v in list(o.results.items())[:max_figures])
    return f"{o.status:6} {o.notebook:34} {o.seconds:6.1f} s  {figures}".rstrip()


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 24 else text[:21] + "..."


def write_summary(outcomes: list[Outcome], out: Path, *, smoke: bool) -> Path:
    """Write summary.json and summary.md under `out`; return the markdown path."""
    (out / "summary.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    lines = [
        "# Notebook run summary",
        "",
        "Mode: "
        + (
            "smoke (embedded tiny model)."
            if smoke
            else "full (falls back to the embedded model without a GPU or the Hub)."
        ),
        "",
        "| notebook | status | seconds | figures |",
        "|---|---|---:|---|",
    ]
    for o in outcomes:
        figures = ", ".join(f"`{k}` = {_short(v)}" for k, v in o.results.items())
        lines.append(f"| {o.notebook} | {o.status} | {o.seconds:.1f} | {figures} |")
    failures = [o for o in outcomes if o.error]
    if failures:
        lines += ["", "## Failures", ""] + [f"```\n{o.error}\n```" for o in failures]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(
    names: list[str] | None = None, *, smoke: bool = False, out: Path = Path("build"), folder: Path = NOTEBOOKS_DIR
) -> int:
    """Run the selected notebooks, print a line each, write the summary; return the exit code."""
    paths = select(names, folder)
    out = Path(out)
    outcomes = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] running {path.stem} ...", flush=True)
        outcome = execute(path, out, smoke=smoke)
        outcomes.append(outcome)
        print(format_line(outcome), flush=True)
        if outcome.error:
            print(outcome.error, file=sys.stderr, flush=True)
    summary = write_summary(outcomes, out, smoke=smoke)
    failed = sum(o.status != "ok" for o in outcomes)
    total = sum(o.seconds for o in outcomes)
    print(
        f"{len(outcomes) - failed} ok, {failed} failed in {total:.1f} s; executed notebooks in "
        f"{out / 'notebooks'}, figures in {out / 'results'}, summary in {summary}"
    )
    return 1 if failed else 0
