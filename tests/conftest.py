"""One headless run of every notebook, shared by every test that reads what a notebook did.

Executing the notebooks is the slow part of the suite. `python -m helpers run --smoke` runs them all
once, in a subprocess started as soon as collection finds a test that needs it, so it works on one
core while the unit tests use the other; the `notebook_run` fixture waits for it. Tests that need
this run are marked `notebooks` (`make test-fast` deselects them).

The run is given a planted wandb key and Hub token (fakes, named as such) and a wandb server that
refuses connections, so notebook 06 takes the "key found, server unreachable" path and a test can
look for the planted values in everything the run printed or wrote.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

FAKE_WANDB_KEY = "local-fake-" + "9d2e4b7c1a" * 4  # the shape of a wandb key; never a real one
FAKE_HF_TOKEN = "hf_plantedFakeTokenForTheNotebookLeakTest01"
TIMEOUT_S = 1200  # the whole run on a loaded 2-core machine takes about 2-4 minutes
FIXTURE = "notebook_run"


@dataclass
class NotebookRun:
    """What `python -m helpers run --smoke` did: exit code, printed text, output folder, figures by stem."""

    returncode: int
    stdout: str
    stderr: str
    out: Path
    results: dict = field(default_factory=dict)
    planted_secrets: tuple[str, ...] = (FAKE_WANDB_KEY, FAKE_HF_TOKEN)

    @property
    def printed(self) -> str:
        return self.stdout + self.stderr

    def summary(self) -> dict[str, dict]:
        return {s["notebook"]: s for s in json.loads((self.out / "summary.json").read_text())}


_started: dict = {}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: a connection is refused at once


def _start() -> None:
    out = Path(tempfile.mkdtemp(prefix="kit-notebook-run-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
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
    log = (out / "stdout.txt").open("w+"), (out / "stderr.txt").open("w+")
    command = [sys.executable, "-m", "helpers", "run", "--smoke", "--out", str(out)]
    _started.update(process=subprocess.Popen(command, stdout=log[0], stderr=log[1], env=env), out=out, log=log)


def pytest_collection_finish(session):
    if any(FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        _start()


def pytest_collection_modifyitems(items):
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.notebooks)


def pytest_sessionfinish(session):
    process = _started.get("process")
    if process is not None and process.poll() is None:
        process.kill()  # a run that is no longer wanted (-x, Ctrl-C) must not outlive the session
        process.wait()
    for log in _started.get("log", ()):
        log.close()


@pytest.fixture(scope="session")
def notebook_run() -> NotebookRun:
    """The shared smoke run of every notebook; waits for the background run to finish."""
    if "process" not in _started:  # collected late (e.g. by a plugin): run it now
        _start()
    process, out, (stdout, stderr) = _started["process"], _started["out"], _started["log"]
    process.wait(timeout=TIMEOUT_S)
    stdout.seek(0), stderr.seek(0)
    run = NotebookRun(process.returncode, stdout.read(), stderr.read(), out)
    run.results = {p.stem: json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))}
    return run
