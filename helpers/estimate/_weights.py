"""The weights: what the model stores while it trains, and what loading it peaks at.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; notebook 05 loads a 7B in 4
bits). The stored weights are the first line of every estimate; the loading peak decides whether a
model can be loaded at all before the first step. Pure Python: no torch.
"""

from __future__ import annotations

from helpers.estimate._job import FP32_BYTES, HALF_BYTES, Job

__all__ = ["load_peak", "stored_weights"]


def stored_weights(job: Job) -> float:
    """1. weights: quantized runs keep embeddings, head and norms in fp32 (peft's k-bit preparation),
    or in 16 bits when everything is 16-bit (litgpt's bf16-true, torchtune). 2. the adapters (and a
    new classifier head) are stored beside a frozen base."""
    counts = job.shape.parameter_counts()
    if job.quantized:
        kept = job.compute if job.true_half else FP32_BYTES
        head = counts["head"] * (not job.harness.quantize_head)  # a quantized head is stored as its linears are
        quantized = counts["linear"] + counts["head"] - head
        stored = quantized * job.weight_bytes + kept * (counts["embeddings"] + head + counts["other"])
    else:
        stored = job.shape.parameters * job.weight_bytes
    return stored if job.method == "full" else stored + job.param_bytes * job.trainable


def load_peak(job: Job, weights: float) -> float:
    """0. loading, before the first step. transformers loads one checkpoint tensor at a time, so a
    16-bit or fp32 model peaks at its own size. With bitsandbytes 4-bit quantization on the fly each
    linear arrives in 16 bits beside its packed codes and scales (2 + 1/2 + 1/8 + 1/64 bytes per
    weight, the largest linear last); then peft's k-bit preparation casts the unquantized
    parameters to fp32 one at a time (the largest, the embedding, in 16 and 32 bits at once).
    Sources: transformers 5.23's core_model_loading.py (one tensor at a time when quantizing on the
    fly) and peft 0.21's utils/other.py (prepare_model_for_kbit_training)."""
    if not job.quantized:
        return weights
    counts, half = job.shape.parameter_counts(), HALF_BYTES
    head = counts["head"] * (not job.harness.quantize_head)
    largest = max([a * b for a, b in job.shape.linear_shapes().values()] + [counts["head"] - head])
    kept = counts["embeddings"] + head + counts["other"]
    quantized = (counts["linear"] + counts["head"] - head) * job.weight_bytes + half * kept
    quantized += (2 + 1 / 2 + 1 / 8 + 1 / 64) * largest
    if job.true_half:  # no k-bit preparation: the unquantized parameters stay in 16 bits
        return max(quantized, weights)
    return max(quantized, weights + half * job.shape.vocab * job.shape.hidden)
