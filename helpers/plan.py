"""Plan a fine-tune onto a card: the ladder of changes that make it fit, cheapest for the student first, each with
the memory after it and what it costs; the stack an estimate assumes (`assumed_stack`); and what a checkpoint costs
to download (`checkpoint_bytes`, notebook 08).

Taught in notebooks 01 (memory anatomy: what fits a T4) and 05 (QLoRA: a 7B plan for a 16 GB card); the
planner's controls (01, 08, `helpers.planner`) and `python -m helpers plan` print the same ladder from
`plan`. Every step is an estimate from `helpers.estimate`; cards come from the shipped catalog
(`helpers.catalog`). Pure Python: no torch, no network.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helpers._util import GIB
from helpers.catalog import card_capability, describe_card, gpu_bytes
from helpers.env import half_precision
from helpers.estimate import (
    ADAMW_FAMILY,
    HALF_BYTES,
    SAFETY_MARGIN,
    WEIGHT_BYTES,
    Estimate,
    estimate_training_memory,
    shape_of,
)
from helpers.job import TrainingJob, job_settings

__all__ = [
    "KERNEL_NAMES",
    "LADDER",
    "LOOP_LABELS",
    "LORA_R_FLOOR",
    "OPTIMIZER_LABELS",
    "SEQ_LEN_FLOOR",
    "Plan",
    "PlanStep",
    "assumed_stack",
    "checkpoint_bytes",
    "format_plan",
    "plan",
]

# the ladder's rungs in the order `plan` tries them, by what they cost the student: first what leaves
# the result and the speed alone, then what costs speed only, then what changes the numbers a little,
# then what is trained, then the data itself
LADDER = (
    "drop the output before backward",
    "SDPA attention",
    "mixed precision",
    "fused loss",
    "gradient checkpointing",
    "gradient accumulation",
    "8-bit optimizer",
    "no LoRA dropout",
    "LoRA",
    "QLoRA",
    "smaller LoRA rank",
    "shorter seq_len",
)
LORA_R_FLOOR = 4  # the smallest LoRA rank the ladder goes down to: below it the adapters learn little
SEQ_LEN_FLOOR = 128  # tokens: the shortest sequence the ladder goes down to
# what each attention kernel is called on screen (helpers/estimate/_attention.py decides which runs)
KERNEL_NAMES = {
    "eager": "eager attention (the scores materialized)",
    "math": "PyTorch SDPA attention, math kernel (the scores materialized)",
    "flash": "PyTorch SDPA attention, flash kernel",
    "efficient": "PyTorch SDPA attention, memory-efficient kernel",
}


@dataclass
class PlanStep:
    """One change applied on the way to fitting a card, and the estimate after it."""

    technique: str
    why: str
    estimate: Estimate
    fits: bool  # fits with the estimator's safety margin to spare (a borderline step does not)
    verdict: str = ""  # "fits", "borderline" or "does not fit" (`Estimate.verdict`)
    cost: str = ""  # what the change costs the student, in speed or quality; "" for the job as asked


class Plan(list):
    """The steps of a plan (PlanStep objects, the job as asked first), and the rungs it tried and left out."""

    def __init__(self):
        super().__init__()
        self.left_out: list[str] = []  # techniques tried that would not have lowered the estimate


@dataclass(frozen=True)
class _Rung:
    technique: str  # one of LADDER
    why: str
    cost: str
    change: dict  # the settings of estimate_training_memory it changes


def plan(model, gpu, job: TrainingJob | None = None, /, **settings) -> Plan:
    """The ladder of changes that makes a job fit `gpu`, cheapest for the student first, with the memory after each.

    The rungs, in LADDER's order: free the model's output before backward (a hand-written loop),
    SDPA attention, mixed precision (nothing, and faster), a fused loss (the same result, one more
    library), gradient checkpointing (about a third more compute), a smaller per-device batch with
    gradient accumulation (slower steps, the same effective batch), an 8-bit optimizer (a little
    precision in its states), no LoRA dropout, LoRA, then QLoRA (both change what is trained), a
    smaller LoRA rank down to LORA_R_FLOOR, then a shorter seq_len down to SEQ_LEN_FLOOR (longer
    examples cut). Each is kept once applied; one that would not lower the estimate is left out (all
    but mixed precision, kept for its speed). The plan stops at the first estimate that fits with the
    estimator's known error to spare (SAFETY_MARGIN): a borderline step is shown as such and the
    plan goes on. The first step is the job as asked; a last step that does not fit means nothing
    more can be done on this card. `left_out` lists the rungs tried and left out.

    Args:
        model: what `estimate_training_memory` takes: a catalog name, a path to a config.json, a Hub id,
            a transformers config or a dict (read once).
        gpu: a catalog card ("T4"), its memory in GiB as a float, or bytes as an int.
        job, settings: the job as asked: a `helpers.job.TrainingJob` and/or its fields by keyword
            (per_device_batch, seq_len, method, ...; precision defaults to the card's half
            precision: bf16 from compute capability 8.0, fp16 below). `harness` and `device` pass
            through to `estimate_training_memory`.

    Example:
        >>> steps = plan("Mistral-7B", "T4", per_device_batch=4, seq_len=512)
        >>> [s.technique for s in steps][-1], steps[-1].fits
        ('QLoRA', True)
    """
    shape = shape_of(model)  # a config.json or a Hub id is read once, not at every step
    card, capability = gpu_bytes(gpu), card_capability(gpu)
    half = half_precision(capability)
    passed = {k: settings.pop(k) for k in ("harness", "device") if k in settings}
    if capability is not None:  # a catalog card: its compute capability decides the attention kernel
        passed["gpu"] = gpu
    current = job_settings(job, caller="plan", **settings).with_precision(half)
    steps = Plan()

    def estimate(changed: TrainingJob) -> Estimate:
        return estimate_training_memory(shape, changed, **passed)

    def take(rung: _Rung, changed: TrainingJob, e: Estimate) -> None:
        nonlocal current
        current = changed
        verdict = e.verdict(card)
        steps.append(PlanStep(rung.technique, rung.why, e, verdict == "fits", verdict, rung.cost))

    take(_Rung("as asked", "the job with the settings given", "", {}), current, estimate(current))
    for rung in _ladder(lambda: current, shape, half, passed.get("harness")):
        if steps[-1].fits:
            break
        changed = replace(current, **rung.change)
        e = estimate(changed)
        if e.total < steps[-1].estimate.total or rung.technique == "mixed precision":
            take(rung, changed, e)
        elif rung.technique not in steps.left_out:
            steps.left_out.append(rung.technique)
    return steps


def _ladder(now, shape, half: str, harness):
    """The rungs still to try, cheapest first, read from the job as `plan` changes it (`now()`: the job now)."""
    if now().loop == "custom":
        why = "loss = model(**batch).loss: the logits go once the loss is computed, as in the Trainer"
        yield _Rung(LADDER[0], why, "nothing", dict(loop="trainer"))
    if now().attn_impl == "eager" and not shape.attn_softcap:  # Gemma 2's soft-capping needs eager
        why = "attn_implementation='sdpa': a fused kernel, not eager matmuls"
        yield _Rung(LADDER[1], why, "nothing: faster", dict(attn_impl="sdpa"))
    if now().precision == "fp32":
        scaling = " (fp16: with loss scaling)" if half == "fp16" else ""
        why = f"autocast to {half}: most activations in 16 bits, while the fp32 weights stay and gain {half} copies"
        yield _Rung(LADDER[2], why, f"nothing: faster on tensor cores{scaling}", dict(precision=half))
    if shape.head == "lm" and not now().fused_loss and not (harness and harness.loss_chunk):
        why = "Liger's fused linear cross-entropy (use_liger_kernel=True): the logits are never held whole"
        yield _Rung(LADDER[3], why, "nothing in the result; one more library", dict(fused_loss=True))
    if not now().checkpointing:
        why = "keep only each layer's input; recompute the rest in backward"
        yield _Rung(LADDER[4], why, "about a third more compute a step", dict(checkpointing=True))
    yield from _halvings(now, "per_device_batch", 1)
    if now().optimizer in ADAMW_FAMILY:
        why = "AdamW's two moments in 8 bits, paged to CPU memory at spikes (bitsandbytes)"
        yield _Rung(LADDER[6], why, "a little precision in its states", dict(optimizer="paged_adamw_8bit"))
    if now().method != "full" and now().lora_dropout > 0:
        why, change = "lora_dropout=0.0: no dropout masks kept", dict(lora_dropout=0.0)
        yield _Rung(LADDER[7], why, "a little less regularization", change)
    if now().method == "full":
        why = "freeze the model in 16 bits, train low-rank adapters"
        cost = "trains adapters only: often a little below a full fine-tune"
        yield _Rung(LADDER[8], why, cost, dict(method="lora", weights=half))
    if now().method != "qlora":
        why = "freeze the model in 4-bit NF4, train low-rank adapters"
        cost = "slower steps (dequantizing), a little quality"
        yield _Rung(LADDER[9], why, cost, dict(method="qlora", weights="nf4"))
    if now().method != "full":  # LoRA or QLoRA by now, unless it was asked for full and a rung failed
        yield from _halvings(now, "lora_r", LORA_R_FLOOR)
    yield from _halvings(now, "seq_len", SEQ_LEN_FLOOR)


def _halvings(now, name: str, floor: int):
    """Halve one setting while it is above `floor` and each halving lowers the estimate; the per-device
    batch with more accumulation steps, so that the effective batch stays the same."""
    while getattr(now(), name) > floor:
        before = getattr(now(), name)
        if name == "per_device_batch":  # the largest divisor of the batch up to its half: batch x steps stays
            smaller = next(d for d in range(before // 2, 0, -1) if before % d == 0)
            steps = now().grad_accum_steps * (before // smaller)
            change = dict(per_device_batch=smaller, grad_accum_steps=steps)
            yield _Rung(LADDER[5], f"per-device batch {smaller} x {steps} accumulation steps", _SLOWER, change)
        elif name == "lora_r":
            smaller = max(floor, before // 2)
            why = f"r={smaller}: fewer adapter weights, gradients and optimizer states"
            yield _Rung(LADDER[10], why, "less capacity to learn", dict(lora_r=smaller))
        else:
            smaller = max(floor, before // 2)
            why = f"seq_len {smaller}: fewer tokens a sequence, activations and logits shrink with them"
            yield _Rung(LADDER[11], why, "longer examples cut: less context learned", dict(seq_len=smaller))
        if getattr(now(), name) == before:  # left out: a smaller one would save less still
            return


_SLOWER = "slower steps; the same effective batch and result"


def format_plan(steps: list[PlanStep], gpu) -> str:
    """The plan as plain text: one line per step with the predicted total against the card and what it costs.

    A step past a rotary model's trained context is marked with * and the note below the ladder says
    what that means (`Estimate.context_note`): the memory holds, the model's quality does not."""
    header = f"{'step':32} {'predicted total':>16}  {'fits':10}  what it does (what it costs)"
    lines = [f"card: {describe_card(gpu)}", header]
    shown = {"fits": "yes", "borderline": "borderline", "does not fit": "no"}
    for s in steps:
        said = f"{s.why} (cost: {s.cost})" if s.cost else s.why
        fits = shown[s.verdict] + ("*" if s.estimate.context_note else "")
        lines.append(f"{s.technique:32} {s.estimate.total / GIB:12.2f} GiB  {fits:10}  {said}")
    lines += [f"* {note}" for note in dict.fromkeys(s.estimate.context_note for s in steps) if note]
    if steps[-1].verdict == "borderline":
        lines.append(
            f"Borderline: the last step is within {SAFETY_MARGIN[steps[-1].estimate.settings['method']]:.0%} "
            "of the card, the estimator's known error; "
            "it may run out of memory. Shorten seq_len or the batch to be sure."
        )
    elif not steps[-1].fits:
        lines.append(
            f"Nothing fits: even the last step needs {steps[-1].estimate.total / GIB:.1f} GiB, with every change "
            "the ladder has. Use a smaller model, or a bigger card (A100-40GB, A100-80GB)."
        )
    return "\n".join(lines)


# how the stack an estimate assumes is said on screen, setting by setting
LOOP_LABELS = {
    "trainer": "the Hugging Face Trainer",
    "custom": "a hand-written loop that keeps `outputs` through backward",
    "litgpt": "litgpt's training loop",
}
OPTIMIZER_LABELS = {
    "adamw": "PyTorch's fused AdamW",
    "adamw_torch_fused": "PyTorch's fused AdamW",
    "adamw_foreach": "torch.optim.AdamW (foreach)",
    "adamw_torch": "torch.optim.AdamW (foreach)",
    "adamw_hf": "transformers' old AdamW",
    "adamw_8bit": "bitsandbytes AdamW 8-bit",
    "adamw_bnb_8bit": "bitsandbytes AdamW 8-bit",
    "paged_adamw_8bit": "bitsandbytes paged AdamW 8-bit",
    "sgd": "SGD",
    "adafactor": "Adafactor",
}


def assumed_stack(e: Estimate) -> str:
    """The software an estimate assumes, said from its settings: loop, precision, method, attention, optimizer,
    checkpointing and fused kernels. The kernels a stack adds are what estimates differ on most.

    Example:
        >>> e = estimate_training_memory("Mistral-7B", per_device_batch=1, seq_len=512, method="qlora", gpu="T4")
        >>> assumed_stack(e).split("; ")[0]
        'assumes: the Hugging Face Trainer'
    """
    s = e.settings
    precision = s["precision"]
    if precision.endswith("-true"):
        precision = f"everything in {precision.removesuffix('-true')} (no fp32 copies)"
    else:
        precision = "fp32 throughout" if precision == "fp32" else f"{precision} mixed precision (autocast)"
    targets = "every linear layer" if s["lora_targets"] == "all-linear" else ", ".join(s["lora_targets"])
    base = "a bitsandbytes NF4 base" if s["method"] == "qlora" else f"a frozen {s['weights']} base"
    method = f"every weight trained ({s['weights']} master weights)"
    if s["method"] != "full":
        method = f"peft LoRA r={s['lora_r']} on {targets} over {base}"
    parts = [
        LOOP_LABELS[s["loop"]],
        precision,
        method,
        KERNEL_NAMES[e.attention] if e.attention else "eager attention",
        OPTIMIZER_LABELS[s["optimizer"]],
        "gradient checkpointing" if s["checkpointing"] else "no gradient checkpointing",
        "a fused linear cross-entropy (Liger's or Unsloth's), no other fused kernels"
        if s["fused_loss"]
        else "no fused kernels (Liger's or Unsloth's would take less)",
    ]
    if "harness" in s:
        parts.append(f"a harness with {s['harness'].changed()}")
    return "assumes: " + "; ".join(parts)


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
