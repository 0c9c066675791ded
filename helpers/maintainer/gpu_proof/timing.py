"""Section "precision" of `python -m helpers gpu-proof`: step time of one model in each precision.

The same ~0.5B model, full fine-tune, in fp32, fp16 autocast and bf16 autocast (those the card
runs natively): two warm-up steps so the kernels are chosen, then TIMED_STEPS timed between two
synchronizations. Each row says its precision and the card it ran on.
"""

from __future__ import annotations

import time

from helpers.maintainer.gpu_proof import _cuda, _models
from helpers.maintainer.gpu_proof._proof import Proof

__all__ = ["TIMED_STEPS", "TIMING_MODEL", "TIMING_SEQ_LEN", "precision_timing"]

TIMING_MODEL, TIMING_SEQ_LEN, TIMED_STEPS = "Qwen2.5-0.5B", 512, 5


def precision_timing(proof: Proof) -> dict:
    """Milliseconds a step of TIMING_MODEL takes in each precision the card supports."""
    model, rows = _models.model(proof, TIMING_MODEL, "full", "fp32"), []
    for precision in _cuda.precisions():
        _models.train_steps(model, precision, TIMING_SEQ_LEN, steps=2, device=proof.device)  # warm-up: kernels chosen
        _cuda.sync()
        start = time.perf_counter()
        _models.train_steps(model, precision, TIMING_SEQ_LEN, steps=TIMED_STEPS, device=proof.device)
        _cuda.sync()
        step_ms = round(1000 * (time.perf_counter() - start) / TIMED_STEPS, 1)
        rows.append({"precision": precision, "step_ms": step_ms, "card": proof.card})
        print(f"  {precision}: {step_ms} ms a step", flush=True)
    return {"model": TIMING_MODEL, "seq_len": TIMING_SEQ_LEN, "rows": rows}
