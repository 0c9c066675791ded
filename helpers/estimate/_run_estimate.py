"""`estimate_run_memory`: a whole run's peak, the batch that sets it, and the verdict on the run.

Private to `helpers.estimate` (taught in notebook 03); `_run` holds the replay, `_step` one step's
estimate. Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helpers._util import GIB
from helpers.catalog import gpu_bytes
from helpers.estimate._allocator import SAFETY_MARGIN
from helpers.estimate._breakdown import Estimate
from helpers.estimate._job import FP32_BYTES, Job
from helpers.estimate._run import Replay, StepShape, batch_lengths, replay
from helpers.estimate._shapes import adapter_shapes
from helpers.estimate._step import forward_of, saved_for_backward, step_estimate

__all__ = ["RunEstimate", "run_estimate"]


@dataclass(frozen=True)
class RunEstimate:
    """What a whole run needs, step by step, in bytes.

    `lengths` is each micro-batch's padded length, `allocated` the one-step estimate's peak at that
    length, `reserved` what torch.cuda.max_memory_reserved reads after each step (the largest one-step
    reserve so far plus what the run's history adds; on a named card, where at its limit the allocator
    gives its cache back, up to the step it runs out at, if it does), `longest` the one-step estimate
    at the longest batch: the figure a plan for one fixed-length step gives. `worst_step` is the step
    (from 0) that sets the run's reserve or runs out; `out_of_memory` the step a card runs out at."""

    lengths: tuple[int, ...]
    allocated: tuple[int, ...]
    reserved: tuple[int, ...]
    after: tuple[int, ...]  # reserved right after each step: torch.cuda.memory_reserved(), as a per-step log reads it
    longest: Estimate
    expandable_segments: bool
    worst_step: int
    out_of_memory: int | None = None
    gpu: str | None = None

    @property
    def peak_reserved(self) -> int:
        return self.reserved[-1]

    @property
    def history(self) -> int:
        """Bytes the run's order of lengths reserves above its longest step run alone (fragmentation)."""
        return max(0, self.peak_reserved - _alone(self.longest, self.expandable_segments))

    @property
    def total(self) -> int:
        """The run's peak reserve plus the CUDA context: what the card must hold."""
        return self.peak_reserved + self.longest.cuda_context

    def verdict(self) -> str:
        """ "fits", "borderline" or "does not fit" over the whole run on the card it was estimated for."""
        if self.gpu is None:
            raise ValueError("a run's verdict needs its card: estimate it with estimate_run_memory(..., gpu='T4')")
        card, margin = gpu_bytes(self.gpu), SAFETY_MARGIN[self.longest.settings["method"]]
        peak = max(self.total, self.longest.load_total)
        if self.out_of_memory is not None or peak > card:
            return "does not fit"
        return "fits" if peak * (1 + margin) <= card else "borderline"

    def line(self) -> str:
        """The whole run in one sentence: the reserve it grows to, the batch that sets it, the verdict on its card."""
        worst = self.lengths[self.worst_step]
        if self.out_of_memory is not None:
            return (
                f"does not fit: a {self.gpu} runs out at step {self.out_of_memory + 1:,} of {len(self.lengths):,} "
                f"(a batch of {worst:,} tokens a sequence), {self.peak_reserved / GIB:.2f} GiB reserved before it; "
                f"the longest batch alone reserves {_alone(self.longest, self.expandable_segments) / GIB:.2f} GiB"
            )
        said = (
            f"over {len(self.lengths):,} steps the reserve grows to {self.peak_reserved / GIB:.2f} GiB at step "
            f"{self.worst_step + 1:,} (a batch of {worst:,} tokens a sequence); the longest batch alone reserves "
            f"{_alone(self.longest, self.expandable_segments) / GIB:.2f} GiB, the lengths' order adds "
            f"{self.history / GIB:.2f} GiB"
        )
        return said if self.gpu is None else f"{self.verdict()} on the {self.gpu}: {said}"


def run_estimate(
    job: Job,
    lengths,
    *,
    batching: str,
    shuffle: bool,
    pad_to_multiple_of: int | None,
    steps: int | None,
    seed: int,
    expandable_segments: bool,
    empty_cache_every: int | None = None,
) -> RunEstimate:
    """The whole run of `job` (its seq_len is the run's max_length) over examples of these `lengths`."""
    run = batch_lengths(
        lengths,
        per_device_batch=job.per_device_batch,
        max_length=job.seq_len,
        batching=batching,
        shuffle=shuffle,
        pad_to_multiple_of=pad_to_multiple_of,
        steps=steps,
        seed=seed,
    )
    ones = {n: step_estimate(replace(job, seq_len=n)) for n in sorted(set(run))}
    shapes = {n: step_shape(replace(job, seq_len=n), e) for n, e in ones.items()}
    longest = ones[max(ones)]
    weights = weight_blocks(job, longest)
    accum, expandable = job.grad_accum_steps, expandable_segments
    anchors: dict[int, tuple[int, int]] = {}

    def anchor(n: int) -> tuple[int, int]:
        """(the one-step reserve, the step replayed alone) at length n: needed only for the longest so far,
        since both grow with the length (the rest of the lengths are never the largest a window has met)."""
        if n not in anchors:
            alone = replay([shapes[n]] * (accum + 1), weights, grad_accum_steps=accum, expandable=expandable)
            anchors[n] = (_base(ones[n], alone, expandable, job.device), alone.reserved[-1])
        return anchors[n]

    capacity = None
    if job.gpu is not None and job.device == "cuda":  # at the card's limit the allocator gives its cache back
        base, alone = anchor(max(ones))
        capacity = gpu_bytes(job.gpu) - longest.cuda_context - (base - alone)  # less the reserve the replay misses
    whole = replay(
        [shapes[n] for n in run], weights, grad_accum_steps=accum, expandable=expandable, capacity=capacity,
        empty_cache_every=empty_cache_every,
    )  # fmt: skip
    # the longest length met over the run, and since the last empty_cache, and their anchors
    reserved, after, most, window = [], [], 0, 0
    for step, n in enumerate(run[: len(whole.reserved)]):  # a run that runs out ends there
        if empty_cache_every and step % empty_cache_every == 0:
            window = 0
        most, window = max(most, n), max(window, n)
        (run_base, run_alone), (window_base, window_alone) = anchor(most), anchor(window)
        reserved.append(run_base + max(0, whole.reserved[step] - run_alone))
        after.append(window_base + max(0, whole.after[step] - window_alone))
    if not reserved:  # out of memory in its first step
        reserved = after = [anchor(run[0])[0]]
    return RunEstimate(
        lengths=run,
        allocated=tuple(ones[n].allocated for n in run),
        reserved=tuple(reserved),
        after=tuple(after),
        longest=longest,
        expandable_segments=expandable,
        worst_step=whole.out_of_memory if whole.out_of_memory is not None else reserved.index(reserved[-1]),
        out_of_memory=whole.out_of_memory,
        gpu=job.gpu,
    )


def _base(e: Estimate, alone: Replay, expandable: bool, device: str) -> int:
    """One step's reserve: on a card, the calibrated figure (`Estimate.reserved`); with expandable segments
    the peak allocated plus the pages the replay maps above its own peak. On a CPU (a CPU's requests, as a
    card's allocator would reserve them) the step replayed alone: no calibrated reserve exists there."""
    if device == "cpu":
        return alone.reserved[-1]
    if not expandable:
        return e.reserved
    return e.allocated + max(0, alone.reserved[-1] - max(alone.allocated))


def _alone(e: Estimate, expandable: bool) -> int:
    """The longest step's reserve, run alone (what a one-step plan says)."""
    return e.allocated if expandable else e.reserved


def step_shape(job: Job, e: Estimate) -> StepShape:
    """The blocks one step of `job` requests (`_run.StepShape`), from the estimator's terms at its length."""
    f = forward_of(job)
    parts, layer = saved_for_backward(job, f)
    shape, grads = job.shape, gradient_blocks(job, e)
    return StepShape(
        length=job.seq_len,
        layers=shape.layers,
        layer=tuple(int(v) for v in layer.values() if v),
        checkpointed_input=int(f.resid * f.tokens * shape.hidden) if job.checkpointing else 0,
        outside=tuple(int(v) for k, v in parts.items() if k not in layer and k != "layer inputs (checkpointed)" and v),
        **head_blocks(job, e),
        backward=e.backward_transient,
        layer_grads=grads[0],
        other_grads=grads[1],
        state_ratio=e.optimizer / e.gradients if e.gradients else 0.0,
        step_ratio=e.optimizer_step / e.gradients if e.gradients else 0.0,
    )


def head_blocks(job: Job, e: Estimate) -> dict:
    """The head's blocks: a causal LM's logits as returned and their fp32 upcast at the forward's end, then
    the loss's two fp32 gradients and their cast back to the compute dtype; otherwise the logits line whole."""
    shape, h, c = job.shape, job.harness, job.compute
    if shape.head != "lm" or job.fused_loss or h.loss_chunk:
        return {"head": (e.logits,)}
    n = job.per_device_batch * job.seq_len * shape.vocab
    returned = n * (FP32_BYTES if h.logits_upcast == "forward" else c)
    upcast = n * FP32_BYTES if c != FP32_BYTES and h.logits_upcast == "loss" else 0
    return {
        "head": tuple(b for b in (returned, upcast) if b),
        "loss_grads": tuple(b for b in (n * FP32_BYTES, n * FP32_BYTES, n * c if c != FP32_BYTES else 0) if b),
    }


def _tensors(job: Job) -> tuple[list[int], list[int]]:
    """Elements of one layer's trainable tensors, and of the others (embeddings, head), for the method."""
    shape = job.shape
    if job.method == "full":
        counts = shape.parameter_counts()
        outer = [n for n in (counts["embeddings"], counts["head"]) if n]
        return [i * o for i, o in shape.linear_shapes().values()], outer
    adapters = adapter_shapes(shape, job.lora_targets).values()
    return [n for i, o in adapters for n in (job.lora_r * i, o * job.lora_r)], []


def gradient_blocks(job: Job, e: Estimate) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each trainable tensor's gradient in bytes, scaled so that all of them add up to the estimate's."""
    layer, other = _tensors(job)
    total = job.shape.layers * sum(layer) + sum(other)
    scale = e.gradients / total if total else 0.0
    return tuple(int(n * scale) for n in layer), tuple(int(n * scale) for n in other)


def weight_blocks(job: Job, e: Estimate) -> tuple[int, ...]:
    """The stored weights, a block per linear, embedding and head, adding up to the estimate's weights."""
    shape, counts = job.shape, job.shape.parameter_counts()
    tensors = [i * o for i, o in shape.linear_shapes().values()] * shape.layers
    tensors += [n for n in (counts["embeddings"], counts["head"]) if n]
    scale = e.weights / sum(tensors)
    return tuple(int(n * scale) for n in tensors)
