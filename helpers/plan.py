"""Plan a fine-tune onto a card: the cheapest techniques that make it fit, with the memory after each; and what
its checkpoint costs to download (`checkpoint_bytes`, notebook 08).

Taught in notebooks 01 (memory anatomy: what fits a T4) and 05 (QLoRA: a 7B plan for a 16 GB
card), and behind `python -m helpers plan`. Every step is an estimate from `helpers.estimate`;
cards come from the shipped catalog (`helpers.catalog`). Pure Python: no torch, no network.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers._util import GIB
from helpers.catalog import card_capability, describe_card, gpu_bytes
from helpers.estimate import (
    ADAMW_FAMILY,
    HALF_BYTES,
    SAFETY_MARGIN,
    WEIGHT_BYTES,
    Estimate,
    estimate_training_memory,
    shape_of,
)
from helpers.estimate._job import batch_argument

__all__ = ["PlanStep", "checkpoint_bytes", "format_plan", "plan"]


@dataclass
class PlanStep:
    """One technique applied on the way to fitting a card, and the estimate after it."""

    technique: str
    why: str
    estimate: Estimate
    fits: bool  # fits with the estimator's safety margin to spare (a borderline step does not)
    verdict: str = ""  # "fits", "borderline" or "does not fit" (`Estimate.verdict`)


def plan(
    model, gpu, *, per_device_batch: int | None = None, batch_size: int | None = None, seq_len: int, **settings
) -> list[PlanStep]:
    """The cheapest sequence of techniques that makes a job fit `gpu`, with the memory after each.

    Techniques are tried in order of what they cost: mixed precision (nothing, and faster),
    gradient checkpointing (about a quarter more compute), a smaller per-device batch with
    gradient accumulation (same effective batch, slower steps; skipped when the gradients, alive
    during the next micro-batch, outweigh the activations it saves), an 8-bit optimizer, LoRA,
    then QLoRA (both change what is trained). Each is kept once applied; the plan stops at the
    first estimate that fits with the estimator's known error to spare (SAFETY_MARGIN): a
    borderline step is shown as such and the plan goes on. The first step is the job as asked.

    Args:
        model: what `estimate_training_memory` takes: a catalog name, a path to a config.json, a Hub id,
            a transformers config or a dict (read once).
        gpu: a catalog card ("T4"), its memory in GiB as a float, or bytes as an int.
        per_device_batch, seq_len: the micro-batch on one device (`batch_size` is its older name).
        settings: any other setting of `estimate_training_memory` (precision defaults to the
            card's half precision: bf16 from compute capability 8.0, fp16 below).

    Example:
        >>> steps = plan("Mistral-7B", "T4", per_device_batch=4, seq_len=512)
        >>> [s.technique for s in steps][-1], steps[-1].fits
        ('QLoRA', True)
    """
    model = shape_of(model)  # a config.json or a Hub id is read once, not at every step
    card, capability = gpu_bytes(gpu), card_capability(gpu)
    half = "bf16" if capability is None or capability >= (8, 0) else "fp16"
    current = dict(settings, per_device_batch=batch_argument(per_device_batch, batch_size, "plan")[1], seq_len=seq_len)
    if capability is not None:  # a catalog card: its compute capability decides the attention kernel
        current.setdefault("gpu", gpu)
    current.setdefault("precision", half)  # the card's half precision unless asked otherwise
    steps: list[PlanStep] = []

    def step(technique: str, why: str, **change) -> bool:
        current.update(change)
        e = estimate_training_memory(model, **current)
        verdict = e.verdict(card)
        steps.append(PlanStep(technique, why, e, verdict == "fits", verdict))
        return steps[-1].fits

    if step("as asked", "the job with the settings given"):
        return steps
    for rung in _ladder(current, half):
        if rung is None:
            done = _accumulate(model, current, steps, step)
        else:
            technique, why, change = rung
            done = step(technique, why, **change)
        if done:
            break
    return steps


def _ladder(current: dict, half: str) -> list[tuple | None]:
    """The techniques still to try, cheapest first: (name, why, the settings it changes); None
    marks gradient accumulation, which needs an estimate of its own before it is taken."""
    ladder: list[tuple | None] = []
    if current.get("precision", "bf16") == "fp32":
        ladder.append(
            ("mixed precision", f"{half} activations: half the bytes, faster on tensor cores", dict(precision=half))
        )
    if not current.get("checkpointing"):
        ladder.append(
            (
                "gradient checkpointing",
                "keep only each layer's input; recompute the rest in backward",
                dict(checkpointing=True),
            )
        )
    ladder.append(None)
    if current.get("optimizer", "adamw") in ADAMW_FAMILY:
        ladder.append(("8-bit optimizer", "AdamW states in 8 bits (bitsandbytes)", dict(optimizer="paged_adamw_8bit")))
    if current.get("method", "full") == "full":
        ladder.append(
            ("LoRA", "freeze the model in 16 bits, train low-rank adapters", dict(method="lora", weights=half))
        )
    if current.get("method") != "qlora":
        ladder.append(
            ("QLoRA", "freeze the model in 4-bit NF4, train low-rank adapters", dict(method="qlora", weights="nf4"))
        )
    return ladder


def _accumulate(model, current: dict, steps: list[PlanStep], step) -> bool:
    """Halve the micro-batch and double accumulation (same effective batch) while that lowers the
    estimate; True once the job fits."""
    accumulation = current.get("grad_accum_steps", 1)
    while current["per_device_batch"] > 1:
        b = current["per_device_batch"] // 2
        trial = estimate_training_memory(model, **dict(current, per_device_batch=b, grad_accum_steps=2 * accumulation))
        if trial.total >= steps[-1].estimate.total:  # the gradients, alive during the next micro-batch,
            return False  # outweigh the activations it saves: accumulation saves nothing here
        accumulation *= 2
        if step(
            "gradient accumulation",
            f"per-device batch {b} x {accumulation} accumulation steps",
            per_device_batch=b,
            grad_accum_steps=accumulation,
        ):
            return True
    return False


def format_plan(steps: list[PlanStep], gpu) -> str:
    """The plan as plain text: one line per step with the predicted total against the card."""
    lines = [f"card: {describe_card(gpu)}", f"{'step':24} {'predicted total':>16}  fits"]
    shown = {"fits": "yes", "borderline": "borderline", "does not fit": "no"}
    for s in steps:
        lines.append(f"{s.technique:24} {s.estimate.total / GIB:12.2f} GiB  {shown[s.verdict]:10}  {s.why}")
    if steps[-1].verdict == "borderline":
        lines.append(
            f"Borderline: the last step is within {SAFETY_MARGIN[steps[-1].estimate.settings['method']]:.0%} "
            "of the card, the estimator's known error; "
            "it may run out of memory. Shorten seq_len or the batch to be sure."
        )
    elif not steps[-1].fits:
        lines.append(
            f"Nothing fits: even the last step needs {steps[-1].estimate.total / GIB:.1f} GiB. "
            "Use a shorter seq_len, a smaller model, or a bigger card (A100-40GB, A100-80GB)."
        )
    return "\n".join(lines)


def checkpoint_bytes(model, weights: str = "bf16") -> int:
    """Bytes of a model's checkpoint on disk, before it is downloaded: what the download and the disk cost.

    Notebook 08 compares the two sources of its 7B. `weights`: "fp32", "bf16" / "fp16" (every
    parameter in that format, as the Hub's original checkpoints are), or "nf4": a pre-quantized
    bitsandbytes checkpoint, its linear layers in 4 bits with their double-quantized scales
    (WEIGHT_BYTES["nf4"]), embeddings, head and norms in 16 bits as saved. `model` as in
    `estimate_training_memory`.

    Example:
        >>> round(checkpoint_bytes("Qwen2.5-7B") / 1e9, 1), round(checkpoint_bytes("Qwen2.5-7B", "nf4") / 1e9, 1)
        (15.2, 5.5)
    """
    if weights not in WEIGHT_BYTES or weights == "int8":
        raise ValueError(f"weights={weights!r}: pass 'fp32', 'bf16', 'fp16' or 'nf4'")
    shape = shape_of(model)
    if weights != "nf4":
        return int(shape.parameters * WEIGHT_BYTES[weights])
    counts = shape.parameter_counts()  # bitsandbytes leaves the output head unquantized, as load_qlora does
    kept = counts["embeddings"] + counts["head"] + counts["other"]
    return int(counts["linear"] * WEIGHT_BYTES["nf4"] + kept * HALF_BYTES)
