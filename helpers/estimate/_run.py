"""A whole run's memory: the reserve the caching allocator grows to over batches of varying length.

Private to `helpers.estimate` (taught in notebook 03, gradient checkpointing and the OOM). One
step's estimate (`_breakdown.Estimate`) is a batch of one length. A run over real data pads each
batch to its longest sequence ("dynamic" padding, the kit's collator), so every step has another
shape: the blocks a short step frees stay cached in segments too small for a longer step's
requests, and torch.cuda's caching allocator reserves new ones. The reserve a run grows to is set
by the order of its lengths, not by its longest batch alone.

How it is modelled: each step's requests, in the order a training step makes them (`StepShape`:
the per-layer walk's saved blocks in forward order, the logits, the backward's transients and
gradients layer by layer, the optimizer's states and temporaries), replayed over the run's batch
lengths through the caching allocator's own policy (`helpers._caching_allocator`). The replay
does not see every transient a real step makes, so it is anchored to the calibrated one-step
estimate: what a run reserves is the largest one-step reserve met so far plus what the run's
history adds above the same steps replayed alone (`history`). Pure Python: no torch.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from helpers._caching_allocator import CachingAllocator, OutOfMemory

__all__ = [
    "ALLOC_CONF",
    "BATCHINGS",
    "MOST_STEPS",
    "Replay",
    "StepShape",
    "batch_lengths",
    "expandable_in_environment",
    "read_lengths",
    "replay",
]

# "dynamic": each batch padded to its longest sequence (DataCollatorForSeq2Seq, the kit's collator);
# "padded": every batch padded to max_length (padding="max_length"); "packed": sequences joined and
# cut into max_length blocks (TRL's packing): every step has one shape
BATCHINGS = ("dynamic", "padded", "packed")
# where PyTorch reads the allocator's settings: the device-generic name (PyTorch 2.9 and later) and the
# CUDA one, which every release reads
ALLOC_CONF = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
MOST_STEPS = 20_000  # a replay is ~1,000 requests a step in pure Python: ~5 ms a step


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """The blocks one training step requests, in bytes, at one batch length (the estimator's terms)."""

    length: int  # the batch's padded sequence length
    layers: int
    layer: tuple[int, ...]  # what one layer saves for backward, block by block, in forward order
    checkpointed_input: int = 0  # with checkpointing: the one block a layer keeps (its input); its saves are recomputed
    outside: tuple[int, ...] = ()  # saved outside the layers: embeddings, final norm, the loss's log-probs
    head: tuple[int, ...] = ()  # the logits as returned and their upcast, freed once the loss is computed
    loss_grads: tuple[int, ...] = ()  # the loss's gradients back to the head, each freed once the next exists
    backward: int = 0  # a layer's backward transients (its input's gradient and its temporaries)
    layer_grads: tuple[int, ...] = ()  # one layer's trainable tensors' gradients
    other_grads: tuple[int, ...] = ()  # the embeddings' and the head's gradients
    state_ratio: float = 0.0  # optimizer state bytes per gradient byte (AdamW in the parameter dtype: 2)
    step_ratio: float = 0.0  # the optimizer step's temporaries per gradient byte (foreach AdamW: 1)


@dataclass(frozen=True)
class Replay:
    """What the allocator did over a run: reserved and allocated after each step, in bytes."""

    reserved: tuple[int, ...]  # the peak reserved up to and including each step
    allocated: tuple[int, ...]  # the peak allocated in each step (rounded blocks, the trace's view)
    out_of_memory: int | None  # the first step the capacity could not hold, or None
    after: tuple[int, ...] = ()  # reserved right after each step (torch.cuda.memory_reserved, before any empty_cache)


def batch_lengths(
    lengths,
    *,
    per_device_batch: int,
    max_length: int,
    batching: str,
    shuffle: bool = True,
    pad_to_multiple_of: int | None = None,
    steps: int | None = None,
    seed: int = 0,
) -> tuple[int, ...]:
    """Each micro-batch's padded length over the run, in the order a seeded shuffle draws them.

    lengths: each example's token count; steps: how many micro-batches (None: one epoch), drawing a
    new shuffle each epoch as the Trainer's sampler does (the order is not torch's own, but a run's
    reserve depends on which lengths come and roughly when, not on the exact permutation); with
    shuffle=False the examples come in the order given, every epoch."""
    counts = list(lengths)
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        bad = next((n for n in counts if isinstance(n, bool) or not isinstance(n, int) or n < 1), None)
        raise ValueError(
            "lengths must hold each example's token count, whole numbers of 1 or more"
            + (f": found {bad!r}" if counts else ": it is empty")
            + "; e.g. lengths=[len(ids) for ids in tokenized['input_ids']]"
        )
    if batching not in BATCHINGS:
        raise ValueError(f"batching={batching!r} is not one of {', '.join(map(repr, BATCHINGS))}")
    if batching == "packed":
        per_epoch = max(1, sum(min(n, max_length) for n in counts) // (max_length * per_device_batch))
    else:
        per_epoch = -(-len(counts) // per_device_batch)
    steps = per_epoch if steps is None else steps
    if not 1 <= steps <= MOST_STEPS:
        raise ValueError(f"steps={steps} is out of range: pass 1 to {MOST_STEPS:,} micro-batches")
    if batching != "dynamic":
        return (max_length,) * steps
    multiple = pad_to_multiple_of or 1
    out, epoch = [], 0
    while len(out) < steps:
        order = list(range(len(counts)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for i in range(0, len(order), per_device_batch):
            longest = min(max_length, max(counts[j] for j in order[i : i + per_device_batch]))
            out.append(-(-longest // multiple) * multiple)
        epoch += 1
    return tuple(out[:steps])


def read_lengths(path) -> list[int]:
    """Examples' token counts from a file: one whole number a line, or a JSON list of them (`plan --lengths`)."""
    from pathlib import Path

    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        import json

        try:
            values = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not a JSON list of token counts: {e.msg} at line {e.lineno}") from None
        lines = [(i + 1, v) for i, v in enumerate(values)]
        where = "item"
    else:
        lines = [(i + 1, line.strip()) for i, line in enumerate(text.splitlines()) if line.strip()]
        where = "line"
    counts = []
    for n, value in lines:
        try:
            count = int(value) if not isinstance(value, (bool, float)) else None
        except ValueError:
            count = None
        if count is None or count < 1:
            raise ValueError(
                f"{path}, {where} {n}: {value!r} is not a token count: write one whole number of 1 or more a line, "
                "e.g. from [len(ids) for ids in tokenized['input_ids']]"
            )
        counts.append(count)
    if not counts:
        raise ValueError(f"{path} holds no token counts: write one whole number a line")
    return counts


def expandable_in_environment(environ=None) -> bool:
    """Whether this process's allocator settings ask for expandable segments ("expandable_segments:True")."""
    environ = os.environ if environ is None else environ
    for name in ALLOC_CONF:
        for option in environ.get(name, "").split(","):
            key, _, value = option.partition(":")
            if key.strip() == "expandable_segments":
                return value.strip().lower() in ("true", "1")
    return False


def replay(
    steps: list[StepShape],
    weights: tuple[int, ...],
    *,
    grad_accum_steps: int = 1,
    expandable: bool = False,
    capacity: int | None = None,
    empty_cache_every: int | None = None,
) -> Replay:
    """Replay a run's requests, step by step, through the caching allocator.

    weights: the model's tensors, allocated before the first step; capacity: the bytes the
    allocator may reserve, or None for no limit; empty_cache_every: the run calls
    torch.cuda.empty_cache() after every this many steps (None: never)."""
    allocator = CachingAllocator(capacity=capacity, expandable=expandable)
    for i, nbytes in enumerate(weights):
        allocator.malloc(("weight", i), nbytes)
    reserved, allocated, after, states = [], [], [], False
    for n, shape in enumerate(steps):
        allocator.peak_allocated = allocator.allocated
        last = (n + 1) % grad_accum_steps == 0 or n == len(steps) - 1
        try:
            _step(allocator, shape, n, grads_exist=n % grad_accum_steps != 0, optimizer_step=last, states=states)
        except OutOfMemory:
            return Replay(tuple(reserved), tuple(allocated), n, tuple(after))
        states = states or last
        reserved.append(allocator.peak_reserved)
        allocated.append(allocator.peak_allocated)
        after.append(allocator.reserved)
        if empty_cache_every and (n + 1) % empty_cache_every == 0:
            allocator.release_cached()
    return Replay(tuple(reserved), tuple(allocated), None, tuple(after))


def _step(a: CachingAllocator, s: StepShape, n: int, *, grads_exist: bool, optimizer_step: bool, states: bool):
    """One micro-batch: forward, backward, and the optimizer's step at the end of an accumulation.

    Each op's output that a layer does not save is a block of its saved tensor's size, freed at
    once; each saved block gets a gradient of its size in the backward, freed when the next exists."""
    for layer in range(s.layers):  # forward: each layer's saved blocks stay until its backward
        if s.checkpointed_input:
            a.malloc((n, "in", layer), s.checkpointed_input)
        for k, nbytes in enumerate(s.layer):
            a.malloc((n, "out", layer, k), nbytes)  # what the next op reads
            if not s.checkpointed_input:
                a.malloc((n, layer, k), nbytes)
            a.release((n, "out", layer, k))
    for k, nbytes in enumerate(s.outside):
        a.malloc((n, "outside", k), nbytes)
    for k, nbytes in enumerate(s.head):
        a.malloc((n, "head", k), nbytes)
    for k in range(len(s.head)):
        a.release((n, "head", k))
    _chain(a, (n, "loss"), s.loss_grads)
    for k in range(len(s.outside)):
        a.release((n, "outside", k))
    for layer in reversed(range(s.layers)):  # backward, last layer first
        if s.checkpointed_input:  # the layer runs again and saves what it saves
            for k, nbytes in enumerate(s.layer):
                a.malloc((n, layer, k), nbytes)
        a.malloc((n, "grad in", layer), s.backward)
        if not grads_exist:
            for k, nbytes in enumerate(s.layer_grads):
                a.malloc(("grad", layer, k), nbytes)
        _chain(a, (n, "grad", layer), s.layer[::-1], free=[(n, layer, k) for k in reversed(range(len(s.layer)))])
        a.release((n, "grad in", layer))
        a.release((n, "in", layer))
    if not grads_exist:
        for k, nbytes in enumerate(s.other_grads):
            a.malloc(("grad", "other", k), nbytes)
    if not optimizer_step:
        return
    grads = [(("grad", layer, k), nbytes) for layer in range(s.layers) for k, nbytes in enumerate(s.layer_grads)]
    grads += [(("grad", "other", k), nbytes) for k, nbytes in enumerate(s.other_grads)]
    if not states:  # the optimizer makes its states at its first step, a block per state per tensor
        for handle, nbytes in grads:
            for state in range(round(s.state_ratio)):
                a.malloc(("state", state, handle), int(nbytes * s.state_ratio / round(s.state_ratio)))
    for handle, nbytes in grads if s.step_ratio else ():
        a.malloc(("temp", handle), int(nbytes * s.step_ratio))
    for handle, _ in grads if s.step_ratio else ():
        a.release(("temp", handle))
    for handle, _ in grads:  # zero_grad(set_to_none=True)
        a.release(handle)


def _chain(a: CachingAllocator, name, sizes, free=()) -> None:
    """Gradients flowing back op by op: each allocated, then the one before it (and that op's saved block) freed."""
    previous = None
    for k, nbytes in enumerate(sizes):
        a.malloc((name, k), nbytes)
        if previous is not None:
            a.release(previous)
        if k < len(free):
            a.release(free[k])
        previous = (name, k)
    if previous is not None:
        a.release(previous)
