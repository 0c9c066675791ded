"""Module-scoped fixtures computed in the suite's background lane (tests/conftest.py), after its notebook runs.

A fixture that spends its time waiting on training processes (a two-node job, a killed and resumed run) holds
the unit tests' core for all of that time; the background lane has one to spare once its notebook runs are
done. Decorate such a fixture's body:

    @background
    def interrupted(folder: Path, env: dict[str, str]):
        ...  # start processes with env=env, write in folder, return what the tests read

It gets a folder of its own and the environment as it was before any test ran (tests change os.environ with
monkeypatch while it runs: every process it starts must be given `env`). Tests that use it run last, as the
notebook readers do, and each gets its value; an error or `pytest.fail` inside it fails each of them. Outside
the lane (a fixture collected late, `pytest -p no:...`), the first test that asks runs it in the foreground.
Names are global: two modules cannot both have a background fixture of one name.

A job that needs another's value names it after `folder` and `env` (`def requeued(folder, env, two_node_runs)`):
it gets that value, computed first (the lane runs jobs in the order they were defined) or raised again.

Jobs run in a thread beside the tests, and CPython 3.11 keeps one depth counter for building `ast` trees per
interpreter (python/cpython#106905): a job and a test parsing at once (export("08") in a job, a quick check's
reader in a test) fail with "SystemError: AST constructor recursion depth mismatch". So `ast.parse` takes one
lock in the tests' process, whichever thread calls it.
"""

from __future__ import annotations

import ast
import inspect
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

JOBS: dict[str, Callable[[Path, dict[str, str]], object]] = {}
SECONDS: dict[str, float] = {}  # wall-clock of each job, for the suite's closing line (never asserted)
_queued: dict[str, threading.Event] = {}
_outcome: dict[str, tuple[bool, object]] = {}  # name -> (raised, value or the exception)
_parse, _parsing = ast.parse, threading.RLock()  # re-entrant: a finalizer that parses may run inside a parse


def _parse_alone(*args, **kwargs):
    with _parsing:
        return _parse(*args, **kwargs)


ast.parse = _parse_alone


def background(function: Callable[[Path, dict[str, str]], object]):
    """Register `function` as a background job; returns the module-scoped fixture that waits for its value."""
    name = function.__name__
    if name in JOBS and JOBS[name].__module__ != function.__module__:
        raise ValueError(f"two background fixtures named {name!r}: {JOBS[name].__module__} and {function.__module__}")
    unknown = [need for need in list(inspect.signature(function).parameters)[2:] if need not in JOBS]
    if unknown:  # the lane runs jobs in the order they were defined: a job it needs must come first
        raise ValueError(f"{name} needs {', '.join(unknown)}: define that background fixture above it")
    JOBS[name] = function

    @pytest.fixture(scope="module", name=name)
    def waiter():
        return value(name, dict(os.environ))

    waiter.__doc__ = function.__doc__
    return waiter


def queue(names: list[str]) -> None:
    """Mark `names` as to be run (by `run`): a waiting fixture then waits instead of running it itself."""
    for name in names:
        _queued.setdefault(name, threading.Event())


def value(name: str, env: dict[str, str]):
    """Job `name`'s value, once it is done (run here, with `env`, if nothing queued it); its exception raised again."""
    if name not in _queued:  # never queued by the lane: run it here
        queue([name])
        run(name, env)
    _queued[name].wait()
    raised, outcome = _outcome[name]
    if raised:
        raise outcome
    return outcome


def run(name: str, env: dict[str, str]) -> None:
    """Run one job now, in a fresh folder, and keep its value or its exception for the tests that use it."""
    start = time.perf_counter()
    try:
        needs = list(inspect.signature(JOBS[name]).parameters)[2:]  # other jobs' values, by name
        values = {need: value(need, env) for need in needs}
        _outcome[name] = (False, JOBS[name](Path(tempfile.mkdtemp(prefix=f"kit-{name}-")), env, **values))
    except BaseException as error:  # noqa: BLE001  pytest.fail's Failed too: raised again in each test
        _outcome[name] = (True, error)
    finally:
        SECONDS[name] = time.perf_counter() - start
        _queued[name].set()
