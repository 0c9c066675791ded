"""Section "notebooks" of `python -m helpers gpu-proof`: every notebook executed on the card.

Each notebook runs in its own `python -m helpers run --only NAME --smoke` process, killed with
everything it started (its Jupyter kernel included) past min(time left, NOTEBOOK_TIMEOUT_S); the
section stops starting notebooks when its budget (`Proof.notebooks_budget_s`, set by
`--notebooks-budget`) is spent and records the rest as skipped. The kit's NVML sampler
(`helpers._probes.nvml_peaks`) reads the card's used memory meanwhile: the idle figure before the
notebook starts, the peak while it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers._probes import nvml_peaks
from helpers._util import MIB
from helpers.maintainer.gpu_proof._proof import NOTEBOOKS_BUDGET_S, Proof

__all__ = ["NOTEBOOKS_BUDGET_S", "NOTEBOOK_TIMEOUT_S", "run_notebooks"]

NOTEBOOK_TIMEOUT_S = 120  # a smoke notebook takes 10-30 s on a GPU; a hung one is killed past this
LEAST_TO_START_S = 30  # a notebook is not started with less than this left of the budget
SAMPLE_INTERVAL_S = 0.1  # how often the card's used memory is read while a notebook runs


def run_notebooks(proof: Proof) -> dict:
    """Every notebook in order, each under min(time left, NOTEBOOK_TIMEOUT_S); a row each, failed unless all ok."""
    from helpers.maintainer import runner

    budget = proof.notebooks_budget_s
    if proof.deadline is not None:  # the run's time limit: the notebooks take what the model sections left
        budget = max(0.0, min(budget, proof.deadline - time.monotonic()))
    deadline, rows = time.monotonic() + budget, []
    for path in runner.select(None):
        left = deadline - time.monotonic()
        if left < LEAST_TO_START_S:
            rows.append({"notebook": path.stem, "status": "skipped", "error": f"budget of {budget:.0f} s spent"})
            continue
        out = (proof.out / "notebook-run" / path.stem).resolve()
        rows.append(_notebook_row(path.stem, out, min(left, NOTEBOOK_TIMEOUT_S)))
        print(f"  {rows[-1]['status']:9} {path.stem} {rows[-1]['seconds']} s {rows[-1]['error']}", flush=True)
    failed = [r["notebook"] for r in rows if r["status"] != "ok"]
    return {"rows": rows, **({"status": "failed", "error": f"not ok: {', '.join(failed)}"} if failed else {})}


def _notebook_command(stem: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "helpers", "run", "--only", stem, "--smoke", "--out", str(out)]


def _notebook_row(stem: str, out: Path, timeout_s: float) -> dict:
    """Run one notebook in its own process (and its kernel), killed with its children past `timeout_s`."""
    from helpers.maintainer.notebooks import REPO_ROOT

    out.mkdir(parents=True, exist_ok=True)
    log, summary = out / "output.log", out / "summary.json"
    summary.unlink(missing_ok=True)
    start = time.perf_counter()
    # a file, not a pipe: a chatty notebook cannot fill it and stall; no NVML (a CPU machine): no sampler
    with nvml_peaks(SAMPLE_INTERVAL_S) as cards, log.open("w") as f:
        process = subprocess.Popen(_notebook_command(stem, out), cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT)
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            timed_out = True
    row = {"notebook": stem, "status": "failed", "seconds": round(time.perf_counter() - start, 1)}
    row.update(card_peak_mib=_card0_mib(cards and cards.peak), idle_mib=_card0_mib(cards and cards.first))
    if timed_out:
        return {**row, "status": "timed out", "error": f"killed after {timeout_s:.0f} s; its output: {log}"}
    if not summary.is_file():
        tail = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
        return {**row, "error": f"exit code {process.returncode}, no summary.json: {tail}"}
    outcome = json.loads(summary.read_text())[0]
    return {**row, "status": outcome["status"], "error": (outcome["error"].strip().splitlines() or [""])[-1]}


def _card0_mib(used: list[int] | None) -> int:
    """Card 0's figure in MiB; 0 where nothing was read (no NVML, no card)."""
    return round(used[0] / MIB) if used else 0


def _kill_tree(pid: int) -> None:
    """Kill the process `pid` and everything it started (a Jupyter kernel runs in a session of its own)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        processes = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)
