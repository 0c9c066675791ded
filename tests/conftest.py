"""Headless runs of every notebook, each executed once and shared by every test that reads it.

Executing the notebooks is the slow part of the suite, so each runs once per configuration that really
differs: `python -m helpers run --smoke` runs them all on this CPU (`notebook_run`), then under a simulated T4
and a simulated Kaggle T4 x2 (`simulated_runs`, `helpers.simulate`; each takes the notebooks listed in `ONLY`).
On a CPU the committed defaults fall back to the same embedded model as the smoke run and differ only in step
counts: nbval runs them as committed in the runtime matrix (noxfile.py), on Colab's and Kaggle's Pythons.

The runs are queued in the background lane (tests/background.py) once collection finds a test that needs them,
and each fixture waits for its own. The lane's first worker takes the runs in order, at the tests' priority,
each followed by the background fixtures that need it (07's train.py under `accelerate launch`); the fixtures
that spend their time on processes (the embedded model's rebuild, the two-node job, pip's dry run of the install
cell) come last, and a second worker takes them from the back at once, at a lower priority, so they mostly use
what the tests and the first worker leave idle; a third runs the fixtures whose results depend on time (a Hub
that stalls, a cell past its timeout). The tests keep their order, except that the modules marked `waits` (their
tests mostly wait out bounds) run first, while the lane fills both cores, and the tests that read the lane run
last. Tests that read a run are marked `notebooks` (`make test-fast` deselects them); tests that use a
background fixture, `slow`. The runs' kernels are forked from one process that has imported torch and
transformers already (tests/warm_kernels.py: about 5 s of imports saved on each of 22 kernels; a kernel whose
environment differs starts cold), and so are the kernels the unit tests start, from a process of their own. The
suite's last line says what each background run took, which worker ran it, and how the kernels started.

Two settings of the tests' own process, both for time: torch runs one thread in it and in everything it
starts (two threads on a shared core spin-wait on each other), and what collection imported is frozen out of
the garbage collector's view once collection is done (`gc.freeze`).

Every run is given a planted wandb key and Hub token (fakes, named as such) and a wandb server that
refuses connections, so notebook 06 takes the "key found, server unreachable" path and a test can
look for the planted values in everything the run printed or wrote.

While editing a notebook, `KIT_ONLY="02" pytest tests/test_mixed_precision_notebook.py` runs only that one
(the tests of the others then fail for want of their figures: read only your own).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import background
import pytest
import warm_kernels
from notebook_results import figures_of

FAKE_WANDB_KEY = "local-fake-" + "9d2e4b7c1a" * 4  # the shape of a wandb key; never a real one
FAKE_HF_TOKEN = "hf_plantedFakeTokenForTheNotebookLeakTest01"
TIMEOUT_S = 1200  # one run on a loaded 2-core machine takes about 1.5-4 minutes
SIMULATED = ("T4", "T4x2")
# each notebook runs under one simulated card: those a second card could confuse (00 counts the
# cards, 02 picks the precision, 06 and 08 train with the Trainer, whose n_gpu counts what it sees)
# under T4 x2, where the single-GPU pin must leave them one T4, as a Colab T4 has; the rest under T4;
# 07, whose launch follows the card count, under both
ONLY = {"T4": ("01", "03", "04", "05", "07"), "T4x2": ("00", "02", "06", "07", "08")}
# fixture -> the runs it reads ("cpu": the real machine; a card name: that card simulated)
# "08-...": notebook 08 again in a kernel of its own, after the cpu run, by papermill's command line with
# these parameters: on the cpu run's finished run, unchanged and with one setting changed (as its
# exercises do), and a run long enough for the lesson's save, disconnect and logging steps
CAPSTONE_RERUNS = {
    "08-again": {"smoke": False, "run_name": "capstone-smoke", "max_steps": 4},
    "08-changed": {"smoke": False, "run_name": "capstone-smoke", "max_steps": 5},
    "08-long": {"smoke": True, "max_steps": 26, "grad_accum_steps": 1},
}
RERUN_CELL_TIMEOUT_S = 300  # a kernel that stops answering fails its test in minutes, not at CI's limit
FIXTURES = {
    "notebook_run": ("cpu",),
    "simulated_runs": SIMULATED,
    "capstone_reruns": tuple(CAPSTONE_RERUNS),
}
KERNEL_RUNS = {run for runs in FIXTURES.values() for run in runs}  # every run starts Jupyter kernels
REPO = Path(__file__).resolve().parents[1]
# Collection imports the libraries and every test module: objects that all live as long as the session, which
# the collector would walk again and again while they load (3 s of collection's 13). It runs again, once,
# when collection is done (pytest_collection_finish).
gc.disable()
# One thread for torch in the tests' process and every process it starts, as in the runs' kernels: the two
# lanes keep a core each. Two threads on a shared core spin-wait on each other: the estimator's CPU grids
# took 101 s with two and 70 s with one, with the other core busy (and 67 s against 60 s idle).
os.environ["OMP_NUM_THREADS"] = "1"
if "torch" in sys.modules:  # a plugin imported it before this file: the variable came too late
    sys.modules["torch"].set_num_threads(1)


@dataclass
class NotebookRun:
    """What one background run did (`python -m helpers run --smoke`, or papermill's): exit code, printed text,
    output folder, figures by stem."""

    returncode: int
    stdout: str
    stderr: str
    out: Path
    results: dict = field(default_factory=dict)
    only: tuple[str, ...] = ()  # the notebooks it was asked to run, by number; () for all
    planted_secrets: tuple[str, ...] = (FAKE_WANDB_KEY, FAKE_HF_TOKEN)

    @property
    def printed(self) -> str:
        return self.stdout + self.stderr

    def summary(self) -> dict[str, dict]:
        return {s["notebook"]: s for s in json.loads((self.out / "summary.json").read_text())}

    def ran(self, stems) -> list[str]:
        """The stems among `stems` this run was asked to run."""
        return [stem for stem in stems if not self.only or stem[:2] in self.only]


_processes: list[subprocess.Popen] = []
_unit_warm: dict[str, str] = {}  # the variables that send the unit tests' kernels to their warm process


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: a connection is refused at once


def _environment(out: Path, session: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in session.items() if not k.startswith("WANDB_")}
    env.pop("MPLBACKEND", None)  # the kernels draw inline, as in Jupyter and Colab, so a test can see each figure
    env.update(
        HF_HUB_OFFLINE="1",  # the tests never touch the network
        WANDB_API_KEY=FAKE_WANDB_KEY,
        HF_TOKEN=FAKE_HF_TOKEN,
        WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}",  # a wandb server that is not there
        WANDB_CONFIG_DIR=str(out / "wandb-config"),
        WANDB_CACHE_DIR=str(out / "wandb-cache"),
        WANDB_DATA_DIR=str(out / "wandb-data"),
        WANDB_ARTIFACT_DIR=str(out / "wandb-artifacts"),
        OMP_NUM_THREADS="1",  # one core for the notebooks, the other for the unit tests
    )
    env.update(_runs_kernels.variables)
    return env


_runs_kernels = warm_kernels.Shared()  # the process the runs' kernels are forked from


def _warm_unit_test_kernels() -> None:
    """Point the kernels the unit tests and the background fixtures start (the runner's, gpu-proof's, the quick
    checks') at a warm process of their own, started with this process's environment: a test that changes a
    variable the imports read gets a cold kernel. Kernels that start before it listens start cold too."""
    process, variables = warm_kernels.start(Path(tempfile.mkdtemp(prefix="kit-warm-kernels-unit-")), dict(os.environ))
    _processes.append(process)
    os.environ.update(variables)
    _unit_warm.update(variables)


def _execute(name: str, session: dict[str, str]) -> NotebookRun:
    """Run `name` in an environment built from `session`: os.environ as it was before any test ran."""
    out = Path(tempfile.mkdtemp(prefix=f"kit-notebooks-{name}-"))
    command = [sys.executable, "-m", "helpers", "run", "--smoke", "--out", str(out)]
    if name != "cpu":
        command += ["--simulate", name]
    only = tuple(os.environ.get("KIT_ONLY", "").split()) or ONLY.get(name, ())
    for number in only:
        command += ["--only", number]
    environment = _environment(out, session)
    cwd = REPO
    if name in CAPSTONE_RERUNS:
        command, only = _capstone_rerun(name, out, environment), ("08",)
        cwd = out if name == "08-long" else background.LANE.value("cpu").out / "work" / "08_capstone"  # cpu's folder
    with (out / "stdout.txt").open("w+") as stdout, (out / "stderr.txt").open("w+") as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=environment, cwd=cwd)
        _processes.append(process)
        try:
            process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        stdout.seek(0), stderr.seek(0)
        run = NotebookRun(process.returncode, stdout.read(), stderr.read(), out, only=only)
    run.results = {p.stem: json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))}
    return run


def _capstone_rerun(name: str, out: Path, environment: dict[str, str]) -> list[str]:
    """papermill's command for one of CAPSTONE_RERUNS; its figures go to out/results/<name>.json."""
    environment.update(HELPERS_RESULTS_DIR=str(out / "results"), HELPERS_NOTEBOOK=name, HELPERS_HEADLESS="1")
    notebook = REPO / "notebooks" / "08_capstone.ipynb"
    return [
        *(sys.executable, "-m", "papermill", str(notebook), str(out / f"{name}.ipynb")),
        *("--cwd", ".", "--no-progress-bar", "--execution-timeout", str(RERUN_CELL_TIMEOUT_S)),
        *("-y", json.dumps(CAPSTONE_RERUNS[name])),
    ]


def _start(names: list[str]) -> None:
    """Queue `names` in the background lane (tests/background.py) and start its workers: the notebook runs
    (`_execute`) in order, those that start kernels in the first worker only, the background fixtures last."""
    # the environment now, before any test runs: the runs start later, while the unit tests set and unset
    # variables (monkeypatch) and start wandb in this process (WANDB_SERVICE)
    session = dict(os.environ)

    def task(name: str):
        return background.job(name, session) if name in background.JOBS else lambda: _kernel_run(name, session)

    tasks = {name: task(name) for name in names}
    first_only = KERNEL_RUNS | {name for name in names if background.needs_runs(name)}  # (waits for the runs)
    added = background.LANE.queue(tasks, stealable=set(names) - first_only, timed=background.TIMED & set(names))
    _runs_kernels.expect(len(KERNEL_RUNS.intersection(added)))
    if added:
        background.LANE.start()


def _kernel_run(name: str, session: dict[str, str]) -> NotebookRun:
    with _runs_kernels.serving(lambda folder: _environment(folder, session)):
        return _execute(name, session)


def _runs_of(fixture: str):
    """Run fixture `fixture`'s value: the cpu run itself, or the runs by name."""
    runs = {name: _wait(name) for name in FIXTURES[fixture]}
    return runs["cpu"] if fixture == "notebook_run" else runs


background.RUNS.update({fixture: functools.partial(_runs_of, fixture) for fixture in FIXTURES})


def pytest_collection_finish(session):
    used = {f for item in session.items for f in getattr(item, "fixturenames", ())}
    wanted = background.in_lane_order(used, FIXTURES)  # the runs the tests read, in order, then the background jobs
    if wanted and not session.config.option.collectonly:
        if KERNEL_RUNS & set(wanted):  # the whole suite, not make test-fast (few kernels)
            _warm_unit_test_kernels()  # first: the background fixtures' kernels are forked there too (the
            # runs' own go to the runs' warm process, whose variables `_environment` puts over these)
        _start(wanted)
    # What collection imported (torch, transformers, every test module: millions of objects that live as long
    # as the session) leaves the garbage collector's view: each full collection walked them all again, about
    # a quarter of the unit tests' time (40 s of make test-fast's 145). Anything a test creates is still
    # collected as usual.
    gc.collect()
    gc.freeze()
    gc.enable()


def pytest_collection_modifyitems(items):
    """Mark the tests that read a notebook run (`notebooks`: also through a background fixture that needs one)
    and those that use a costly fixture (`slow`); run the modules marked `waits` first, while the lane keeps
    both cores busy, and every test that waits for the lane (a run, a background fixture) last: by then it is
    done."""
    reading = [item for item in items if set(getattr(item, "fixturenames", ())) & {*FIXTURES, *background.JOBS}]
    for item in reading:
        if any(f in FIXTURES or background.needs_runs(f) for f in item.fixturenames):
            item.add_marker(pytest.mark.notebooks)
    for item in items:  # a test module names its costly fixtures (SLOW_FIXTURES): every test that uses one is slow
        if set(getattr(item, "fixturenames", ())) & set(getattr(getattr(item, "module", None), "SLOW_FIXTURES", ())):
            item.add_marker(pytest.mark.slow)
    waiting = [item for item in items if item.get_closest_marker("waits") and item not in reading]
    items[:] = waiting + [item for item in items if item not in reading and item not in waiting] + reading


def pytest_sessionfinish(session):
    _runs_kernels.stop()
    for process in _processes:
        if process.poll() is None:
            process.kill()  # a run that is no longer wanted (-x, Ctrl-C) must not outlive the session
            process.wait()


def pytest_terminal_summary(terminalreporter):
    """One line: what each background run took and who ran it, to see where the suite's time goes."""
    if background.LANE.seconds:
        by_thread: dict[str, list[str]] = {}
        for name, seconds in background.LANE.seconds.items():
            by_thread.setdefault(background.LANE.ran_by[name], []).append(f"{name} {seconds:.0f} s")
        costs = "; ".join(f"{WORKERS.get(who, 'the tests')}: {', '.join(runs)}" for who, runs in by_thread.items())
        served, unit = warm_kernels.served(_runs_kernels.variables), warm_kernels.served(_unit_warm)
        kernels = f"; their kernels: {served['warm']} forked warm, {served['cold']} started cold"
        kernels = kernels if _runs_kernels.variables else ""
        if _unit_warm:
            kernels += f"; the unit tests' kernels: {unit['warm']} forked warm, {unit['cold']} started cold"
        terminalreporter.write_line(f"background runs, by who ran them: {costs}{kernels}")
    # the repository's conftest.py sends them there; the newest three sessions' folders are kept
    terminalreporter.write_line(f"this session's temporary files: {os.environ.get('TMPDIR', '?')}")


WORKERS = {"lane": "first worker", "lane-back": "second worker", "lane-timed": "third worker"}


def _wait(name: str) -> NotebookRun:
    _start([name])  # collected late (e.g. by a plugin): queued now; a run already queued keeps its place
    return background.LANE.value(name)


# What the kit's setup writes into the student's process: helpers.start pins the card and asks for expandable
# segments, seed_everything (transformers' set_seed) sets the hash seed for the processes it starts.
KIT_WRITES = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "PYTHONHASHSEED")


def _restoring_kit_writes():
    before = {name: os.environ.get(name) for name in KIT_WRITES}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# Each test (and each module, for its module-scoped fixtures) that calls the setup leaves the environment as it
# found it: a pinned card or a hash seed left behind would reach every later test's processes (and send their
# kernels to start cold).
_kit_writes_stay_in_their_test = pytest.fixture(autouse=True)(_restoring_kit_writes)
_kit_writes_stay_in_their_module = pytest.fixture(autouse=True, scope="module")(_restoring_kit_writes)


@pytest.fixture(scope="session")
def notebook_run() -> NotebookRun:
    """The smoke run of every notebook on this CPU."""
    return _runs_of("notebook_run")


@pytest.fixture(scope="module")
def figures(request, notebook_run) -> dict[str, dict]:
    """The figures the test module's NOTEBOOKS recorded in the smoke run on this CPU, each checked ok."""
    return figures_of(notebook_run, request.module.NOTEBOOKS)


@pytest.fixture(scope="module")
def ran(figures, notebook_run) -> tuple[dict[str, dict], Path]:
    """(figures by stem, the run's output folder: executed notebooks, summary) for the module's NOTEBOOKS."""
    return figures, notebook_run.out


@pytest.fixture(scope="session")
def capstone_reruns() -> dict[str, NotebookRun]:
    """Notebook 08 run again by papermill (CAPSTONE_RERUNS), by name; each executed copy in out/<name>.ipynb."""
    return _runs_of("capstone_reruns")


@pytest.fixture(scope="session")
def background_kernels(notebook_run, simulated_runs, capstone_reruns) -> dict[str, int]:
    """Once every run that starts kernels is done: {"warm": kernels forked warm, "cold": kernels started cold}."""
    return warm_kernels.served(_runs_kernels.variables)


@pytest.fixture(scope="session")
def simulated_runs() -> dict[str, NotebookRun]:
    """The smoke runs of every notebook under a simulated T4 and a simulated T4 x2, by card."""
    return _runs_of("simulated_runs")
