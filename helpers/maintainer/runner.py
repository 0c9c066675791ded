"""`python -m helpers run`: execute the notebooks headless with papermill and report what they measured.

`make run` is this command; the tests run it with `--smoke`. For each notebook it writes
`<out>/notebooks/<stem>.ipynb` (the executed copy), `<out>/results/<stem>.json` (what the
notebook passed to `helpers.record`), then `<out>/summary.md` and `<out>/summary.json`.

Every notebook runs, whatever happens to the others, and the summary is always written: a failing
cell, a kernel that dies (killed for memory), a cell that runs past `--cell-timeout`, a file that is
not a notebook, or anything else that stops one notebook is one failed row, named with its cause
(`helpers.maintainer.failures`: a few KB at most, printable; the executed copy keeps the whole
error). Only regular files are opened: a named pipe, a device or a socket named like a notebook, or
a link to one, is a failed row that says so, never opened (a pipe would block the run for good).
An interrupt, Ctrl-C or SIGTERM (what a scheduler or CI sends to stop a job), writes the summary
too: the notebook it stopped as "interrupted", those it did not reach as "not run".
The exit code: 0 when every notebook ran clean, 1 when any did not, 128 + the signal's number after
an interrupt (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a process a signal ended.

`--cell-timeout SECONDS` bounds each cell: 300 s by default with `--smoke` (the slowest smoke
notebook takes about 20 s in all on a laptop CPU: room for a loaded CI machine), 3600 s without
(a real 7B download or fine-tune cell on a T4). A cell past it fails its notebook, and the kernel
is shut down; the next notebook starts in a fresh one.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import math
import re
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from helpers._util import environ, read_regular_file
from helpers.maintainer.failures import describe_failure, printable
from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.results import load_results
from helpers.simulate import VARIABLE as simulate_variable

__all__ = [
    "CELL_TIMEOUT_S",
    "Outcome",
    "UsageError",
    "declared_parameters",
    "execute",
    "format_line",
    "progress",
    "run",
    "select",
    "write_summary",
]

# What --smoke injects where the parameters cell declares it (a quick run times one step, not a median).
SMOKE_PARAMETERS = {"smoke": True, "max_steps": 4, "timing_steps": 1}
# seconds one cell may run before its notebook fails (--cell-timeout): see the module docstring
CELL_TIMEOUT_S = {"smoke": 300.0, "full": 3600.0}
MAX_CELL_TIMEOUT_S = 7 * 24 * 3600.0  # a week: past this, a typo more likely than a plan


class UsageError(ValueError):
    """Bad command-line input; the message says what would work."""


@dataclass
class Outcome:
    notebook: str
    status: str  # "ok", "failed", or after an interrupt "interrupted" (the one it stopped) or "not run"
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


def execute(
    path: Path, out: Path, *, smoke: bool, simulate: str | None = None, cell_timeout: float | None = None
) -> Outcome:
    """Execute one notebook with papermill; never raises for anything that stops the notebook.

    A failing cell, a dead kernel, a cell past `cell_timeout` seconds (default: `CELL_TIMEOUT_S`
    for the mode), a file that is not a notebook: each is a failed Outcome whose `error` names the
    cause and the cell. `simulate` ("T4", "T4x2", "A100") runs it on this CPU as if on that card
    (`helpers.simulate`).
    """
    cell_timeout = cell_timeout or CELL_TIMEOUT_S["smoke" if smoke else "full"]
    stem = path.stem
    results_file = out / "results" / f"{stem}.json"
    executed = out / "notebooks" / f"{stem}.ipynb"
    start = time.perf_counter()
    try:
        _papermill(path, executed, results_file, out / "work" / stem, smoke, simulate, cell_timeout)
        error = ""
    except Exception as e:  # one notebook's end, whatever its cause: the next one still runs
        error = describe_failure(path, executed, e, cell_timeout)
    seconds = time.perf_counter() - start
    try:
        results = load_results(results_file)
    except (OSError, ValueError) as e:  # a results file the notebook left unreadable
        unreadable = f"{path.name}: its results file {results_file} does not read back ({e})"
        results, error = {}, error or printable(unreadable)
    return Outcome(stem, "failed" if error else "ok", seconds, results, error)


def _papermill(path, executed, results_file, workdir, smoke, simulate, cell_timeout) -> None:
    """Run papermill on one notebook; raises what papermill, nbclient or nbformat raise."""
    import papermill as pm

    # papermill re-reads the parameters cell for its report and warns about every line whose
    # comment holds an "=", which the kit's style does on purpose; declared_parameters reads it
    logging.getLogger("papermill.translators").setLevel(logging.ERROR)
    results_file.unlink(missing_ok=True)  # figures from an earlier run must not pass as this run's
    executed.unlink(missing_ok=True)  # nor an executed copy from an earlier run
    workdir.mkdir(parents=True, exist_ok=True)
    executed.parent.mkdir(parents=True, exist_ok=True)
    declared = declared_parameters(path)  # reads the notebook, only if a regular file, before papermill opens it
    parameters = {"smoke": smoke} if "smoke" in declared else {}
    if smoke:
        parameters.update({k: v for k, v in SMOKE_PARAMETERS.items() if k in declared})
    # the kernel inherits these; record() reads them
    kernel_env = {"HELPERS_RESULTS_DIR": str(results_file.parent.resolve()), "HELPERS_NOTEBOOK": path.stem}
    kernel_env[simulate_variable] = simulate or ""  # an empty value: the real machine
    # ipykernel 6 on Python 3.12+ (Colab's, Kaggle's) has debugpy warn about frozen modules at every start
    kernel_env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    with environ(kernel_env):
        pm.execute_notebook(
            str(path),
            str(executed),
            parameters=parameters,
            kernel_name="python3",
            cwd=str(workdir),
            progress_bar=False,
            # whole seconds: traitlets before 5.8 (Colab's and Kaggle's 5.7.1) refuses a float here
            execution_timeout=math.ceil(cell_timeout),
        )


def declared_parameters(path: Path) -> set[str]:
    """Names the notebook's `parameters` cell assigns.

    Read with `ast` rather than papermill's line parser, which skips a line whose comment holds
    an "=" (`grad_accum_steps = 16  # effective batch = 1 x 16 x 1 = 16`, the kit's own style).
    """
    import nbformat

    nb = nbformat.reads(read_regular_file(path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if not cells:
        return set()
    try:
        tree = ast.parse(cells[0].source)
    except SyntaxError:  # nothing to inject into; the kernel reports the cell's error when it runs it
        return set()
    return {
        t.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    }


def format_line(o: Outcome, max_figures: int = 5) -> str:
    """One line per notebook: status, seconds and its first recorded figures."""
    figures = "  ".join(f"{k}={_short(v)}" for k, v in list(o.results.items())[:max_figures])
    return f"{o.status:6} {o.notebook:34} {o.seconds:6.1f} s  {figures}".rstrip()


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 24 else text[:21] + "..."


def write_summary(outcomes: list[Outcome], out: Path, *, smoke: bool, simulate: str | None = None) -> Path:
    """Write summary.json and summary.md under `out`; return the markdown path."""
    (out / "summary.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    mode = (
        "smoke (embedded tiny model)." if smoke else "full (falls back to the embedded model without a GPU or the Hub)."
    )
    lines = ["# Notebook run summary", "", f"Mode: {mode}"]
    if simulate:
        lines += ["", f"**Simulated {simulate} on a CPU**: no figure below is a GPU measurement (`helpers.simulate`)."]
    lines += [
        "",
        "| notebook | status | seconds | figures |",
        "|---|---|---:|---|",
    ]
    for o in outcomes:
        figures = ", ".join(f"`{k}` = {_short(v)}" for k, v in o.results.items())
        lines.append(f"| {o.notebook} | {o.status} | {o.seconds:.1f} | {figures} |")
    failures = [o for o in outcomes if o.error]
    if failures:
        lines += ["", "## Failures", ""] + [_fenced(o.error) for o in failures]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _fenced(text: str) -> str:
    """`text` as a Markdown code block whose fence is longer than any run of backticks in it, which cannot end it."""
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
    return f"{fence}\n{text}\n{fence}"


def run(
    names: list[str] | None = None,
    *,
    smoke: bool = False,
    out: Path | None = None,
    folder: Path = NOTEBOOKS_DIR,
    simulate: str | None = None,
    cell_timeout: float | None = None,
) -> int:
    """Run the selected notebooks, print a line each, write the summary; return the exit code.

    `out` defaults to build/, or build/simulated-<card>/ under `simulate`, so a simulation never
    overwrites the figures of a real run. `cell_timeout` (seconds per cell) defaults to
    `CELL_TIMEOUT_S["smoke"]` or `CELL_TIMEOUT_S["full"]`. Returns 0 when every notebook ran
    clean, 1 when any failed, 128 + the signal's number after Ctrl-C (130) or SIGTERM (143); the
    summary is written in every case.
    """
    paths = select(names, folder)
    cell_timeout = _check_cell_timeout(
        CELL_TIMEOUT_S["smoke" if smoke else "full"] if cell_timeout is None else cell_timeout
    )
    if simulate:
        simulate = _check_card(simulate)
    out = _check_out(Path(out) if out is not None else Path("build") / (f"simulated-{simulate}" if simulate else ""))
    if simulate:
        print(f"simulating {simulate} on this CPU: no figure of this run is a GPU measurement", flush=True)
    outcomes: list[Outcome] = []
    running = None  # (path, start) of the notebook in progress: the row an interrupt leaves "interrupted"
    stopped = None  # the signal that interrupted the run, if one did
    try:
        with _sigterm_as_interrupt():
            for i, path in enumerate(paths, 1):
                running = (path, time.perf_counter())
                with progress(f"[{i}/{len(paths)}] running {path.stem} ..."):
                    outcome = execute(path, out, smoke=smoke, simulate=simulate, cell_timeout=cell_timeout)
                outcomes.append(outcome)
                running = None
                print(format_line(outcome), flush=True)
                if outcome.error:
                    print(outcome.error, file=sys.stderr, flush=True)
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM raised as _Stopped
        stopped = getattr(e, "signum", signal.SIGINT)
        print(
            f"interrupted ({signal.Signals(stopped).name}): the notebook it stopped is listed as interrupted, "
            "those not reached as not run",
            file=sys.stderr,
            flush=True,
        )
    finally:  # whatever stopped the loop, the summary says how far it got
        outcomes += _unfinished(paths, outcomes, running, out)
        summary = write_summary(outcomes, out, smoke=smoke, simulate=simulate)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("ok", "failed", "interrupted", "not run")}
    print(
        ", ".join(f"{n} {s}" for s, n in counts.items() if n or s in ("ok", "failed"))
        + f" in {sum(o.seconds for o in outcomes):.1f} s; executed notebooks in "
        f"{out / 'notebooks'}, figures in {out / 'results'}, summary in {summary}"
    )
    return 128 + stopped if stopped else 0 if counts["ok"] == len(outcomes) else 1


def _unfinished(paths: list[Path], outcomes: list[Outcome], running, out: Path) -> list[Outcome]:
    """Rows for the notebooks without an outcome: the one an interrupt stopped, then those it kept from starting."""
    ran = {o.notebook for o in outcomes}
    rows = []
    for p in (p for p in paths if p.stem not in ran):
        if running and p == running[0]:
            seconds = time.perf_counter() - running[1]
            executed = out / "notebooks" / f"{p.stem}.ipynb"
            why = f"{p.name}: interrupted after {seconds:.1f} s, while it ran; the cells it ran are in {executed}"
            rows.append(Outcome(p.stem, "interrupted", seconds, error=printable(why)))
        else:
            why = f"{p.name}: not run (the run was interrupted before it started)"
            rows.append(Outcome(p.stem, "not run", 0.0, error=printable(why)))
    return rows


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt: papermill and nbclient stop (and end the kernel) alike."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """For the block, SIGTERM stops the run as Ctrl-C does (`_Stopped`); then the previous handler is back."""
    previous = signal.getsignal(signal.SIGTERM)
    # only the main thread may set a handler; one ignored on purpose (SIG_IGN) stays ignored, and one
    # set outside Python (None) could not be put back afterwards
    if threading.current_thread() is not threading.main_thread() or previous in (None, signal.SIG_IGN):
        yield
        return

    def stop(signum, frame):
        raise _Stopped

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def progress(line: str, stream=None):
    """Print `line` for the block; on a terminal, rewrite it in place with the seconds elapsed.

    Not a terminal (a pipe, a log, CI, the tests): `line` once, exactly as it reads.
    """
    stream = stream or sys.stdout
    if not stream.isatty():
        print(line, file=stream, flush=True)
        yield
        return
    start, done = time.perf_counter(), threading.Event()

    def show(end=""):
        stream.write(f"\r{line} {time.perf_counter() - start:.0f} s{end}")
        stream.flush()

    def tick():  # once a second until the block ends
        while not done.wait(1.0):
            show()

    show()
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        show(end="\n")


def _check_cell_timeout(seconds) -> float:
    """A per-cell timeout in seconds: finite, positive, at most a week; a UsageError otherwise."""
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 < value <= MAX_CELL_TIMEOUT_S:  # also refuses nan and inf
        raise UsageError(
            f"--cell-timeout {seconds!r} is not a number of seconds between 0 and {MAX_CELL_TIMEOUT_S:g}: pass e.g. "
            f"--cell-timeout {CELL_TIMEOUT_S['smoke']:g} (the --smoke default) or {CELL_TIMEOUT_S['full']:g}"
        )
    return value


def _check_out(out: Path) -> Path:
    """`out` as a folder this process can write (created if missing); a UsageError that says what to pass otherwise."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder: pass a folder (created if missing), e.g. --out build")
    probe = out / ".write-test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(
            f"--out {out} cannot be written ({e.strerror or type(e).__name__}): pass a folder you can write to, "
            "e.g. --out build"
        ) from None
    return out


def _check_card(card: str) -> str:
    """The simulated card's name as the kit spells it; a UsageError listing the cards otherwise."""
    from helpers.simulate import CARDS

    match = {name.lower(): name for name in CARDS}.get(card.strip().lower())
    if match is None:
        raise UsageError(f"--simulate {card!r} is not a card the kit simulates: use one of {', '.join(CARDS)}")
    return match
