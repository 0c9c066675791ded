"""`python -m helpers run`: execute the notebooks headless with papermill and report what they measured.

`make run` is this command; the tests run it with `--smoke`. This module is the command: which
notebooks (`select`), the loop over them, its interrupts and its exit code. Each notebook is
executed by `helpers.maintainer.execution` (`<out>/notebooks/<stem>.ipynb`, the executed copy, and
`<out>/results/<stem>.json`, what the notebook passed to `helpers.record`); the report is
`helpers.maintainer.summary` (a line per notebook, then `<out>/summary.md` and `<out>/summary.json`).

Every notebook runs, whatever happens to the others, and the summary is always written: a failing
cell, a kernel that dies (killed for memory), a cell that runs past `--cell-timeout`, a file that is
not a notebook, or anything else that stops one notebook is one failed row, named with its cause.
An interrupt, Ctrl-C or SIGTERM (what a scheduler or CI sends to stop a job), writes the summary
too: the notebook it stopped as "interrupted", those it did not reach as "not run". No process a
notebook started outlives its row, whichever way it ended (`execution.end_processes`); a note
under the row names any the runner had to end.
The exit code: 0 when every notebook ran clean, 1 when any did not, 128 + the signal's number after
an interrupt (130 for Ctrl-C, 143 for SIGTERM), as a shell reports a process a signal ended.

`--cell-timeout SECONDS` bounds each cell: `CELL_TIMEOUT_S` by default, 300 s with `--smoke` and
3600 s without (`helpers.maintainer.execution` says why), at most `MAX_CELL_TIMEOUT_S`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from pathlib import Path

from helpers.maintainer.execution import CELL_TIMEOUT_S, Outcome, execute
from helpers.maintainer.failures import printable
from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.maintainer.summary import format_line, write_summary
from helpers.simulate import CARDS, find_card

__all__ = ["MAX_CELL_TIMEOUT_S", "UsageError", "progress", "run", "select"]

MAX_CELL_TIMEOUT_S = 7 * 24 * 3600.0  # a week: past this, a typo more likely than a plan


class UsageError(ValueError):
    """Bad command-line input; the message says what would work."""


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
                for note in outcome.notes:  # processes the notebook left running, which execute() ended
                    print(f"note: {note}", file=sys.stderr, flush=True)
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
    match = find_card(card)
    if match is None:
        raise UsageError(f"--simulate {card!r} is not a card the kit simulates: use one of {', '.join(CARDS)}")
    return match
