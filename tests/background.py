"""The suite's background lane: the notebook runs (tests/conftest.py) and the fixtures that wait on processes.

The lane is one queue of named tasks, run by three worker threads beside the tests. The first takes every
task from the front, in order (the notebook runs, which share one warm kernel server), at the tests'
priority. The second takes the tasks marked `stealable` from the back (the model's rebuild, the fixtures
below) from the start, at a lower priority: it mostly uses what the tests and the first worker leave idle (a
test waiting out a bound or on a kernel), yet never stops, so a wall-clock bound in its tasks still holds on a
slow machine. The third runs the fixtures whose results depend on time (`timed=True`), at the tests'
priority. A test that needs a task no worker has started yet runs that task itself instead of waiting.

A module-scoped fixture that spends its time waiting on training processes (a two-node job, a killed and
resumed run) joins the lane by decorating its body:

    @background
    def interrupted(folder: Path, env: dict[str, str]):
        ...  # start processes with env=env, write in folder, return what the tests read

It gets a folder of its own and the environment as it was before any test ran (tests change os.environ with
monkeypatch while it runs: every process it starts must be given `env`). Tests that use it run last, as the
notebook readers do, and each gets its value; an error or `pytest.fail` inside it fails each of them. Outside
the lane (a fixture collected late, `pytest -p no:...`), the first test that asks runs it in the foreground.
Names are global: two modules cannot both have a background fixture of one name.

A job that needs another's value names it after `folder` and `env` (`def requeued(folder, env, two_node_runs)`):
it gets that value, computed first (by the worker that needs it, if no worker has started it) or raised again.
It may name a notebook run's fixture the same way (`notebook_run`, RUNS): tests/conftest.py queues it right after
that run, for the first worker, so it runs beside the tests instead of after them.

The workers are threads, which makes two things in the tests' process one thread at a time:
- `ast.parse`: CPython 3.11 keeps one depth counter for building trees per interpreter (python/cpython#106905),
  and a job and a test parsing at once (export("08") in a job, a quick check's reader in a test) fail with
  "SystemError: AST constructor recursion depth mismatch".
- Starting a process, and writing a file to execute (`write_executable`): a process another thread starts
  holds every file open in this one from its fork to its exec, which on a loaded machine can be long enough
  for a script written meanwhile to fail to run with "Text file busy" (a FAKE scontrol, seen once).
"""

from __future__ import annotations

import ast
import collections
import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

JOBS: dict[str, Callable[..., object]] = {}  # the @background fixtures' bodies, by name
RUNS: dict[str, Callable[[], object]] = {}  # the notebook runs' fixtures a job may need (tests/conftest.py): its value
TIMED: set[str] = set()  # the jobs registered with timed=True
SECONDS: dict[str, float] = {}  # about how long each job takes alone on 2 idle cores (`seconds=`): the order's hint
# The second worker's and its processes': CFS gives it a third of a core a busy one leaves it (weights 335 to
# 1024); at 19 (weight 15) its venvs, pip runs and two-node jobs could wait out their timeouts on a slow machine.
NICENESS = 5
_parse, _parsing = ast.parse, threading.RLock()  # re-entrant: a finalizer that parses may run inside a parse


def _parse_alone(*args, **kwargs):
    with _parsing:
        return _parse(*args, **kwargs)


ast.parse = _parse_alone
_spawning, _execute_child = threading.RLock(), subprocess.Popen._execute_child


def _spawn_alone(self, *args, **kwargs):
    with _spawning:  # held until the child has exec'd (Popen waits for that): no file of ours leaks into it
        return _execute_child(self, *args, **kwargs)


subprocess.Popen._execute_child = _spawn_alone


def write_executable(path: Path, text: str) -> Path:
    """Write `text` to `path` and make it executable, with no process starting meanwhile (see above)."""
    with _spawning:
        path.write_text(text)
        path.chmod(0o755)
    return path


class Lane:
    """Named tasks, queued in order, each run once by whichever thread gets to it first (`start`'s workers, or
    a test that needs it before they do); their values and exceptions kept for every test that asks."""

    def __init__(self):
        self.seconds: dict[str, float] = {}  # wall-clock of each task, for the suite's closing line (never asserted)
        self.ran_by: dict[str, str] = {}  # the thread that ran each: "lane", "lane-back", "lane-timed", a test's
        self._tasks: dict[str, Callable[[], object]] = {}
        self._pending: collections.deque[str] = collections.deque()  # queued, not yet started, in order
        self._stealable: set[str] = set()
        self._timed: set[str] = set()
        self._finished: dict[str, threading.Event] = {}
        self._outcome: dict[str, tuple[bool, object]] = {}  # name -> (raised, value or the exception)
        self._lock = threading.Lock()

    def queue(
        self, tasks: dict[str, Callable[[], object]], stealable: Iterable[str] = (), timed: Iterable[str] = ()
    ) -> list[str]:
        """Add `tasks` at the back, in order, and return the names added (a name queued before keeps its place
        and its task); those named in `stealable` may be taken by the second worker, those in `timed` only by
        the third."""
        added = []
        with self._lock:
            for name, task in tasks.items():
                if name not in self._finished:
                    self._tasks[name], self._finished[name] = task, threading.Event()
                    self._pending.append(name)
                    added.append(name)
            self._stealable.update(stealable)
            self._timed.update(timed)
        return added

    def start(self) -> None:
        """Three workers: the first takes every task from the front, in order, at the tests' priority; the second
        takes the stealable ones from the back, at a lower one (`_fill_gaps`); the third takes the timed ones, in
        order, at the tests' priority (at a lower one, a step a bound allows could miss it).
        Each stops when nothing is left for it."""
        for name, take, fills_gaps in (("lane", self._front, False), ("lane-back", self._back, True),
                                       ("lane-timed", self._timed_one, False)):  # fmt: skip
            threading.Thread(target=self._work, args=(take, fills_gaps), name=name, daemon=True).start()

    @staticmethod
    def _fill_gaps() -> None:
        """Give this worker thread, and every process it starts, a lower priority (Linux keeps a nice value per
        thread, and a child inherits its thread's): it then mostly runs when the tests and the first worker leave
        a core idle. At their priority it took a third of the machine from them: the notebook runs, the longest
        chain, took 206 s instead of 74, and the suite 490 s instead of 375."""
        if sys.platform == "linux":  # elsewhere the value is the whole process's: the tests' own too
            os.nice(NICENESS)

    def queued(self, name: str) -> bool:
        return name in self._finished

    def value(self, name: str):
        """Task `name`'s value once it is done, run here if no worker has started it; its exception raised again."""
        if self._claim(name):
            self._run(name)
        self._finished[name].wait()
        raised, outcome = self._outcome[name]
        if raised:
            raise outcome
        return outcome

    def _front(self) -> str | None:
        return self._take(lambda pending: [name for name in pending if name not in self._timed])

    def _back(self) -> str | None:
        return self._take(lambda pending: [n for n in reversed(pending) if n in self._stealable - self._timed])

    def _timed_one(self) -> str | None:
        return self._take(lambda pending: [name for name in pending if name in self._timed])

    def _take(self, order: Callable[[collections.deque[str]], list[str]]) -> str | None:
        """The first name `order` lists from the queue, taken off it; None when it lists none."""
        with self._lock:
            names = order(self._pending)
            if names:
                self._pending.remove(names[0])
            return names[0] if names else None

    def _claim(self, name: str) -> bool:
        with self._lock:
            if name in self._pending:
                self._pending.remove(name)
                return True
            return False

    def _work(self, take: Callable[[], str | None], fills_gaps: bool = False) -> None:
        if fills_gaps:
            self._fill_gaps()
        while (name := take()) is not None:
            self._run(name)

    def _run(self, name: str) -> None:
        """Run one task now, in this thread, and keep its value or its exception for the tests that use it."""
        start = time.perf_counter()
        try:
            self._outcome[name] = (False, self._tasks[name]())
        except BaseException as error:  # noqa: BLE001  pytest.fail's Failed too: raised again in each test
            self._outcome[name] = (True, error)
        finally:
            self.seconds[name], self.ran_by[name] = time.perf_counter() - start, threading.current_thread().name
            self._finished[name].set()


LANE = Lane()  # the suite's: tests/conftest.py queues the notebook runs and the background fixtures the tests use


def background(function: Callable[..., object] | None = None, *, timed: bool = False, seconds: float = 0):
    """Register `function` as a background job; returns the module-scoped fixture that waits for its value.
    `@background(timed=True)`: a job whose result depends on time, for the third worker: bounds it waits out (a
    Hub that stalls) or processes that must keep pace with each other (two ranks whose peak depends on when
    each gathers). `seconds`: about how long it takes alone on 2 idle cores (the suite's last line says what it
    took), so that the second worker starts the longest first and the lane does not end on one of them."""
    if function is None:
        return lambda function: background(function, timed=timed, seconds=seconds)
    name = function.__name__
    if name in JOBS and JOBS[name].__module__ != function.__module__:
        raise ValueError(f"two background fixtures named {name!r}: {JOBS[name].__module__} and {function.__module__}")
    unknown = [need for need in list(inspect.signature(function).parameters)[2:] if need not in {*JOBS, *RUNS}]
    if unknown:  # a job's needs are defined before it, so no two jobs can wait for each other
        raise ValueError(f"{name} needs {', '.join(unknown)}: define that background fixture above it")
    JOBS[name], SECONDS[name] = function, seconds
    (TIMED.add if timed else TIMED.discard)(name)

    @pytest.fixture(scope="module", name=name)
    def waiter():
        return value(name, dict(os.environ))

    waiter.__doc__ = function.__doc__
    return waiter


def job(name: str, env: dict[str, str]) -> Callable[[], object]:
    """Background job `name` as a task: run in a fresh folder, with `env` and the values of the jobs it names."""

    def task():
        values = {need: RUNS[need]() if need in RUNS else value(need, env) for need in needs(name)}
        return JOBS[name](Path(tempfile.mkdtemp(prefix=f"kit-{name}-")), env, **values)

    return task


def needs(name: str) -> list[str]:
    """What background job `name` needs: the parameters it names after `folder` and `env`."""
    return list(inspect.signature(JOBS[name]).parameters)[2:]


def in_lane_order(used: Iterable[str], runs: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """The lane's tasks for the fixtures in `used`, in the order to queue them. First the runs of each fixture of
    `runs` used (fixture -> its runs' names, in order), each fixture's followed by the jobs that need it (the last
    of those they need), for the first worker. Then the other jobs, the shortest first (`seconds`), for the first
    worker to take once its runs are done, and the longest last, where the second worker starts them; a job that
    needs another goes to the very back, where the second worker starts it (and, through it, the job it needs)
    first: a chain of jobs is the longest work it has. Left to the end, a long job would run alone with a core
    idle (pip's dry run of the install cell, 30 s at the end of a 359 s run)."""
    used, runs = set(used), runs or {}
    jobs = [name for name in JOBS if name in used]
    after = {f: [job for job in jobs if [need for need in runs if need in needs(job)][-1:] == [f]] for f in runs}
    ordered = [name for f in runs if f in used or after[f] for name in (*runs[f], *after[f])]
    rest = [name for name in jobs if name not in ordered]
    return ordered + sorted(rest, key=lambda name: (any(need in JOBS for need in needs(name)), SECONDS[name]))


def needs_runs(name: str) -> bool:
    """Whether `name` is a job that needs a notebook run (RUNS): one for the first worker, after that run."""
    return name in JOBS and any(need in RUNS for need in needs(name))


def value(name: str, env: dict[str, str]):
    """Background job `name`'s value from the suite's lane, queued there first (with `env`) if nothing did."""
    if not LANE.queued(name):
        LANE.queue({name: job(name, env)})
    return LANE.value(name)
