"""One notebook executed headless with papermill: what `python -m helpers run` does for each notebook.

`execute` writes `<out>/notebooks/<stem>.ipynb` (the executed copy) and reads back
`<out>/results/<stem>.json` (what the notebook passed to `helpers.record`) as an `Outcome`. It
never raises for anything that stops the notebook: a failing cell, a kernel that dies (killed for
memory), a cell that runs past its timeout, a file that is not a notebook is a failed Outcome named
with its cause (`helpers.maintainer.failures`: a few KB at most, printable; the executed copy keeps
the whole error). Only regular files are opened: a named pipe, a device or a socket named like a
notebook, or a link to one, is a failed Outcome that says so, never opened (a pipe would block the
run for good). `helpers.maintainer.runner` (the command) chooses the notebooks and loops over them.

The cell timeout: 300 s by default with `--smoke` (the slowest smoke notebook takes about 20 s in
all on a laptop CPU: room for a loaded CI machine), 3600 s without (a real 7B download or fine-tune
cell on a T4). A cell past it fails its notebook, and the kernel is shut down; the next notebook
starts in a fresh one.

Nothing a notebook starts outlives it: every process its kernel starts (a `!sleep 600 &` shell job,
a `subprocess.Popen` never waited for, a daemon that left the kernel's session) inherits
`RUN_TOKEN` in its environment, which names this one execution. When papermill returns or raises
(the notebook ran clean, failed, ran past its timeout, or Ctrl-C or SIGTERM stopped the run), every
process still carrying that value is sent SIGTERM, then SIGKILL after `END_GRACE_S`, and the
Outcome's `notes` name what was ended. A reparented orphan (its parent gone) or a new session is
found all the same: the search is by the value, not by the process tree.
"""

from __future__ import annotations

import ast
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from helpers._util import HEADLESS, environ, read_regular_file
from helpers.maintainer.failures import describe_failure, printable
from helpers.results import load_results
from helpers.simulate import VARIABLE as simulate_variable

__all__ = [
    "CELL_TIMEOUT_S",
    "END_GRACE_S",
    "RUN_TOKEN",
    "SMOKE_PARAMETERS",
    "Outcome",
    "declared_parameters",
    "end_processes",
    "execute",
]

# What --smoke injects where the parameters cell declares it (a quick run times one step, not a median).
SMOKE_PARAMETERS = {"smoke": True, "max_steps": 4, "timing_steps": 1}
# seconds one cell may run before its notebook fails (--cell-timeout): see the module docstring
CELL_TIMEOUT_S = {"smoke": 300.0, "full": 3600.0}
# the environment variable every process of one execution inherits, and how long each gets to end on SIGTERM
RUN_TOKEN = "HELPERS_RUN_TOKEN"
END_GRACE_S = 3.0


@dataclass
class Outcome:
    notebook: str
    status: str  # "ok", "failed", or after an interrupt "interrupted" (the one it stopped) or "not run"
    seconds: float
    results: dict = field(default_factory=dict)
    error: str = ""
    notes: list[str] = field(default_factory=list)  # what the runner did besides running it (processes ended)


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
    start, token, ended = time.perf_counter(), uuid.uuid4().hex, []
    try:
        _papermill(path, executed, results_file, out / "work" / stem, smoke, simulate, cell_timeout, token)
        error = ""
    except Exception as e:  # one notebook's end, whatever its cause: the next one still runs
        error = describe_failure(path, executed, e, cell_timeout)
    finally:  # also on Ctrl-C or SIGTERM (a KeyboardInterrupt), which the runner reports
        ended = end_processes(token)
    seconds = time.perf_counter() - start
    try:
        results = load_results(results_file)
    except (OSError, ValueError) as e:  # a results file the notebook left unreadable
        unreadable = f"{path.name}: its results file {results_file} does not read back ({e})"
        results, error = {}, error or printable(unreadable)
    notes = [_ended_note(path, ended)] if ended else []
    return Outcome(stem, "failed" if error else "ok", seconds, results, error, notes)


def end_processes(token: str, grace_s: float = END_GRACE_S) -> list[str]:
    """End every process whose environment has `RUN_TOKEN` = `token`; each one as "pid 123 (sleep 600)".

    SIGTERM first, SIGKILL for those still running after `grace_s` seconds; searched again until
    none is left (a shell loop may start one more as it ends), at most five times.
    """
    import psutil

    ended = []
    for _ in range(5):
        found = [p for p in _carrying(psutil, token) if p.pid != os.getpid()]
        if not found:
            break
        ended += [f"pid {p.pid} ({_command(p)})" for p in found]
        for signal_them in ("terminate", "kill"):
            for p in found:
                try:
                    getattr(p, signal_them)()
                except psutil.Error:  # it ended meanwhile, or is no longer ours to signal
                    pass
            deadline = time.monotonic() + grace_s
            while (found := [p for p in found if _running(psutil, p)]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not found:
                break
    return ended


def _carrying(psutil, token: str) -> list:
    """The processes this user may read whose environment holds RUN_TOKEN=token."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_TOKEN) == token:
                found.append(p)
        except (psutil.Error, OSError):  # gone, a zombie, or another user's: not one the kernel started
            continue
    return found


def _running(psutil, p) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE  # a zombie has ended; only its parent can reap it
    except psutil.Error:
        return False


def _command(p) -> str:
    try:
        return printable(" ".join(p.cmdline()) or p.name())[:80]
    except Exception:  # gone between the search and now
        return "ended"


def _ended_note(path: Path, ended: list[str]) -> str:
    listing = ", ".join(ended[:5]) + (f" and {len(ended) - 5} more" if len(ended) > 5 else "")
    return printable(
        f"{path.name} left {len(ended)} process{'es' if len(ended) != 1 else ''} running when it ended: "
        f"{listing}; the runner ended {'them' if len(ended) != 1 else 'it'}. To keep a background job's work, "
        "wait for it in the notebook (process.wait(), or wait in the same shell cell)"
    )


def _papermill(path, executed, results_file, workdir, smoke, simulate, cell_timeout, token) -> None:
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
    kernel_env[HEADLESS] = "1"  # no front end: the planner and the quick checks print, never open widgets
    kernel_env[simulate_variable] = simulate or ""  # an empty value: the real machine
    # ipykernel 6 on Python 3.12+ (Colab's, Kaggle's) has debugpy warn about frozen modules at every start
    kernel_env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    kernel_env[RUN_TOKEN] = token  # inherited by every process the kernel starts: end_processes finds them
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
