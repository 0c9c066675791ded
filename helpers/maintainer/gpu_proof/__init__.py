"""`python -m helpers gpu-proof --out DIR`: the kit proven on one real CUDA card, in one command.

For a machine with one CUDA GPU and no internet; about 5-7 minutes on an H100/H200 class card,
under 9 at worst with the default notebooks budget (each notebook, and all of them, run under a
time limit, so nothing waits forever). It writes `DIR/gpu-proof.md` (the tables a reviewer reads)
and `DIR/gpu-proof.json` (the same figures) before each section (marked "in progress", so a run
killed mid-section says which one it died in) and after it (so a run cut short still leaves what
it measured). The header names the card, the pinned versions and the kit's commit (git's HEAD,
else $KIT_COMMIT, else "unknown"; dirty or not).

The sections, in the order they run by default (`--order` changes it, `--only` picks some); the
model sections come first, so a machine taken back early still leaves the figures only a card gives:

1. estimator (`estimator`): the estimator against `torch.cuda.max_memory_allocated` on models built
   from catalog configs with random weights (nothing downloaded): a ~0.5B model full and LoRA, a
   ~1.5B LoRA, a 7B QLoRA, checkpointing off and on, 512 and 1024 tokens, in the card's precision,
   with the signed error of each line; the 7B QLoRA again in fp16, labelled as standing for a T4;
2. headline (`headline`): a 7B QLoRA training step, loading included, in the T4's precision, in a
   process whose allocator may hold what a T4's can (`torch.cuda.set_per_process_memory_fraction`);
3. oom (`headline`): a real `torch.OutOfMemoryError` caught, and `helpers.oom.fit_batch` recovering
   with the effective batch kept;
4. precision (`timing`): step time of a ~0.5B model in fp32, fp16 autocast and bf16 autocast
   (what the card supports);
5. notebooks (`notebooks`): every notebook executed on the GPU with the embedded model, each in
   its own `python -m helpers run --only NAME --smoke` process killed past NOTEBOOK_TIMEOUT_S,
   within a budget (`--notebooks-budget`, NOTEBOOKS_BUDGET_S by default): pass/fail, seconds, the
   card's peak memory sampled through NVML while it ran.

Every row says the precision it ran in and the card it ran on. The 7B is built once with random
bf16 weights and saved to a scratch folder (/dev/shm when it has room, so no disk write); the
estimator and headline load it in 4 bits from there, as a student loads a download (`_models`).
Without CUDA it says so in one sentence on stderr and exits 3 (`NO_GPU_EXIT`): its figures cannot be
simulated honestly, and a script that runs it must not read "nothing was run" as success. Exit codes:
0 every section ran ok, 1 a section failed, 2 bad arguments, 3 no CUDA GPU (nothing run).
tests/test_gpu_proof.py runs every section's code on CPU with tiny models instead, with the few
CUDA-only calls (`_cuda`: peak bytes, the memory cap, the card's size, name and precisions)
replaced by fakes. `report` writes the files.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from helpers.maintainer.gpu_proof import _cuda
from helpers.maintainer.gpu_proof._proof import NOTEBOOKS_BUDGET_S, Proof
from helpers.maintainer.gpu_proof.estimator import ESTIMATOR_CASES, estimator_grid
from helpers.maintainer.gpu_proof.headline import oom_recovery, run_headline
from helpers.maintainer.gpu_proof.notebooks import run_notebooks
from helpers.maintainer.gpu_proof.report import IN_PROGRESS, kit_commit, write
from helpers.maintainer.gpu_proof.timing import precision_timing

__all__ = ["ESTIMATOR_CASES", "SECTIONS", "main", "run_proof"]

NEEDS_GPU = (
    "error: gpu-proof needs one CUDA GPU (torch.cuda.is_available() is False here); nothing was run. "
    'Run it on a machine with a CUDA GPU (README, "On a real GPU").'
)
NO_GPU_EXIT = 3  # not 0: nothing was proven; not 1 or 2, which mean a failed section and bad arguments
# in the order they run by default: the figures only a card gives first, the notebooks (which a CPU
# run also checks) last, so a machine taken back early has already given what it was lent for
SECTIONS = {
    "estimator": estimator_grid,
    "headline": run_headline,
    "oom": oom_recovery,
    "precision": precision_timing,
    "notebooks": run_notebooks,
}


def main(
    out: Path,
    *,
    only: Sequence[str] = (),
    order: Sequence[str] | None = None,
    notebooks_budget_s: float = NOTEBOOKS_BUDGET_S,
    time_limit_s: float | None = None,
) -> int:
    """Run the sections (in `order`, those in `only`) and write DIR/gpu-proof.{md,json}; 0 unless one failed
    (1), the arguments are wrong (2) or there is no CUDA GPU (3, nothing run)."""
    import torch

    try:
        _sections_to_run(only, order)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(NEEDS_GPU, file=sys.stderr)
        return NO_GPU_EXIT
    from helpers.simulate import VARIABLE as SIMULATE

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no internet: nothing, here or in a notebook, waits on the Hub
    os.environ[SIMULATE] = ""  # this card's own figures, never those of a card `helpers.simulate` pretends
    report = run_proof(
        Path(out), only=only, order=order, notebooks_budget_s=notebooks_budget_s, time_limit_s=time_limit_s
    )
    failed = [name for name, section in report["sections"].items() if section.get("status") != "ok"]
    print(f"wrote {Path(out) / 'gpu-proof.md'}" + (f"; failed sections: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def run_proof(
    out: Path,
    *,
    only: Sequence[str] = (),
    order: Sequence[str] | None = None,
    notebooks_budget_s: float = NOTEBOOKS_BUDGET_S,
    time_limit_s: float | None = None,
    device: str = "cuda",
    precision: str | None = None,
) -> dict:
    """The sections one after another, each isolated: one that raises is recorded as failed and the rest go on.

    Args:
        out: the folder for gpu-proof.json and gpu-proof.md (created if needed).
        only: run just these sections (default: all those in `order`).
        order: the sections to run, in this order (default: SECTIONS' order, the notebooks last).
        notebooks_budget_s: seconds for all the notebooks; those left when it is spent are skipped.
        time_limit_s: seconds for the whole run, from now: the notebooks get at most what the sections
            before them left (scripts/device_gpu_proof.sh passes what its lease leaves).
        device, precision: default to the card and what it supports; the tests pass "cpu" and "bf16".

    Returns:
        the report written: {"machine": {..., "commit", "dirty"}, "sections": {name: {"status", ...}}}.

    Raises:
        ValueError: `only` or `order` names a section that does not exist (the message lists them).
    """
    names = _sections_to_run(only, order)
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": {**_cuda.machine(), **kit_commit()}, "sections": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-proof-", dir=_cuda.scratch_root(), ignore_cleanup_errors=True) as s:
        card = report["machine"]["card"]
        proof = Proof(out, Path(s), device, precision or _cuda.precision(), card, notebooks_budget_s, deadline)
        for name in names:
            _run_section(name, proof, report)
    return report


def _sections_to_run(only: Sequence[str], order: Sequence[str] | None) -> list[str]:
    """The names to run, in order; a ValueError that lists the sections when one named is not one of them."""
    order = list(SECTIONS) if order is None else list(order)
    unknown = [name for name in (*only, *order) if name not in SECTIONS]
    if unknown:
        raise ValueError(f"no section {', '.join(map(repr, unknown))}; the sections: {', '.join(SECTIONS)}")
    twice = sorted({name for name in order if order.count(name) > 1})
    if twice:
        raise ValueError(f"the order names {', '.join(twice)} more than once: name each section once")
    names = [name for name in order if not only or name in only]
    if not names:
        raise ValueError(f"nothing to run: none of {', '.join(only)} is in the order {', '.join(order)}")
    return names


def _run_section(name: str, proof: Proof, report: dict) -> None:
    """Mark `name` in progress on disk, run it, record its result or its error, and write the report again."""
    print(f"== {name}", flush=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    report["sections"][name] = {"status": IN_PROGRESS, "started": started}
    write(proof.out, report)  # a run killed in this section says so
    start = time.perf_counter()
    try:
        result = {"status": "ok", **SECTIONS[name](proof)}
    except Exception as e:  # the report says which section failed and why; the others still run
        result = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    result.update(started=started, seconds=round(time.perf_counter() - start, 1))
    report["sections"][name] = result
    _cuda.release()
    write(proof.out, report)  # after every section: a run cut short keeps what it measured
