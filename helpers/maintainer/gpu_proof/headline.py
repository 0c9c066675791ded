"""Sections "headline" and "oom" of `python -m helpers gpu-proof`: the claims a T4 student relies on.

- headline: a 7B QLoRA training step, loading included, in the T4's precision, in a process whose
  allocator may hold what a T4's can (`torch.cuda.set_per_process_memory_fraction`); it says the
  card it ran on (`ran_on`) and the card it stands for (`stands_for`).
- oom: a real `torch.OutOfMemoryError` caught under a tight cap, and `helpers.oom.fit_batch`
  recovering from it with the effective batch kept.
Both lift the cap again however they end.
"""

from __future__ import annotations

import time

from helpers._util import GIB
from helpers.maintainer.gpu_proof import _cuda, _models
from helpers.maintainer.gpu_proof._proof import Proof

__all__ = [
    "HEADLINE_CARD",
    "HEADLINE_MODEL",
    "HEADLINE_SEQ_LEN",
    "OOM_BATCH",
    "OOM_MODEL",
    "OOM_SEQ_LEN",
    "run_headline",
    "oom_recovery",
]

HEADLINE_MODEL, HEADLINE_CARD, HEADLINE_SEQ_LEN = "Mistral-7B", "T4", 1024
OOM_MODEL, OOM_BATCH, OOM_SEQ_LEN = "Qwen2.5-0.5B", 32, 1024  # 32 x 1024 tokens: ~110 GiB by the estimator


def run_headline(proof: Proof) -> dict:
    """Load the 7B in 4 bits and train it at HEADLINE_SEQ_LEN inside a T4's memory, in a T4's precision."""
    from helpers.catalog import gpu_bytes
    from helpers.estimate import CUDA_CONTEXT_BYTES

    card, total = gpu_bytes(HEADLINE_CARD), _cuda.total_bytes()
    if total < card:
        return {"status": "failed", "error": f"this card ({total / GIB:.1f} GiB) is smaller than a {HEADLINE_CARD}"}
    cap = card - CUDA_CONTEXT_BYTES  # what a T4's allocator has once its CUDA context took its share
    precision = _models.stand_in_precision(HEADLINE_CARD)  # fp16
    folder = _models.saved(proof, HEADLINE_MODEL)  # made before the cap, as a download is
    _cuda.release()
    _cuda.cap_memory(cap / total)  # the allocator refuses past this, as a T4 would
    try:
        start = time.perf_counter()
        model = _models.load_qlora(folder, precision, proof.device)
        loaded = _cuda.peak_bytes()
        _models.set_checkpointing(model, True)
        _cuda.release()
        _models.train_steps(model, precision, HEADLINE_SEQ_LEN, device=proof.device)
        step_peak, wall_s = _cuda.peak_bytes(), time.perf_counter() - start
        model = None
    finally:
        _cuda.cap_memory(1.0)
    config = _models.config(HEADLINE_MODEL)
    estimate = _models.estimate(config, precision, HEADLINE_SEQ_LEN, "qlora", True, proof.device)
    return {
        "model": HEADLINE_MODEL,
        "card": HEADLINE_CARD,
        "cap_gib": round(cap / GIB, 2),
        "precision": precision,
        "seq_len": HEADLINE_SEQ_LEN,
        "load_peak_gib": round(loaded / GIB, 2),
        "step_peak_gib": round(step_peak / GIB, 2),
        "estimated_gib": round(estimate.allocated / GIB, 2),
        "passed": True,
        "wall_s": round(wall_s, 1),
        "ran_on": proof.card,
        "stands_for": HEADLINE_CARD,
    }


def oom_recovery(proof: Proof) -> dict:
    """Ask for OOM_BATCH sequences under a cap of about two: fit_batch must catch the errors and halve."""
    from helpers.oom import fit_batch

    one = _models.estimate(_models.config(OOM_MODEL), proof.precision, OOM_SEQ_LEN, "lora", False, proof.device)
    cap = 2 * one.reserved  # room for a per-device batch of about 2, far from OOM_BATCH
    train, caught = _oom_train(proof, _models.model(proof, OOM_MODEL, "lora", proof.precision))
    _cuda.release()
    _cuda.cap_memory(cap / _cuda.total_bytes())
    try:
        fitted = fit_batch(train, {"per_device_train_batch_size": OOM_BATCH, "gradient_accumulation_steps": 1})
    finally:
        _cuda.cap_memory(1.0)
    kept = all(b * k == OOM_BATCH for b, k in fitted.tried)
    return {
        "model": OOM_MODEL,
        "cap_gib": round(cap / GIB, 2),
        "tried": [list(t) for t in fitted.tried],
        "errors_caught": len(caught),
        "first_error": caught[0] if caught else "",
        "effective_batch_kept": kept,
        "precision": proof.precision,
        "ran_on": proof.card,
        **({} if caught and kept else {"status": "failed", "error": "no out-of-memory error, or the batch changed"}),
    }


def _oom_train(proof: Proof, model):
    """fit_batch's `train`: one optimizer step of the batch it asks for; the errors it caught, in a list."""
    import torch

    caught = []

    def train(args):
        model.zero_grad(set_to_none=True)  # an attempt that failed in backward leaves gradients behind
        b, k = args["per_device_train_batch_size"], args["gradient_accumulation_steps"]
        try:  # one optimizer step of b x k sequences
            _models.train_steps(
                model,
                proof.precision,
                OOM_SEQ_LEN,
                steps=1,
                per_device_batch=b,
                grad_accum_steps=k,
                device=proof.device,
            )
        except torch.OutOfMemoryError as e:
            caught.append(str(e).splitlines()[0][:160])
            raise
        return args

    return train, caught
