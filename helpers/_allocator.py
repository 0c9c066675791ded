"""The peak of what torch's CPU allocator holds during a block: a CPU stand-in for torch.cuda's peak.

No notebook calls it: tests/test_estimate_allocator.py and `python scripts/bench_estimator.py
--allocator` hold the estimator (`helpers.estimate`, taught in notebook 01) to it. Saved-tensor
hooks (`helpers.saved_tensors`) see only what autograd saves; this sees every byte the allocator
hands out, so also what an autograd function keeps as an attribute of its ctx, the transient
buffers (a dequantized 4-bit weight, the loss's backward) and the moment inside backward when the
most is alive.

How: torch's own profiler with `profile_memory=True` records a signed `[memory]` event for each
allocation and each free made while it runs; their running sum, in time order, is the bytes
allocated above the level at entry, and its maximum is the peak. Pure Python, no compiler.

Two blind spots. A tensor allocated before the block and freed inside it is not seen to go
(torch warns "Memory block of unknown size was allocated before the profiling started"): the peak
then reads too high, never too low; the garbage collector runs at entry so that no unreachable
tensor is freed unseen. Memory a library allocates outside torch's allocator is not seen at all:
on CPU, oneDNN's own buffers, such as the copy of a weight repacked for a bf16 matmul (up to
1.9 MB in the bench's bf16 QLoRA step, which cuBLAS on a GPU does not make).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Allocations", "track_allocations"]


@dataclass
class Allocations:
    """What torch's CPU allocator did during a `track_allocations` block, in bytes above its level at entry."""

    peak: int = 0  # the most allocated at one moment
    end: int = 0  # allocated at exit (what the block left behind)
    events: int = 0  # allocations and frees seen


@contextmanager
def track_allocations():
    """Measure the peak bytes torch's CPU allocator holds inside the block, above its level at entry.

    The CPU counterpart of `torch.cuda.reset_peak_memory_stats()` then
    `torch.cuda.max_memory_allocated()`, read from torch's profiler (`profile_memory=True`): every
    allocation and free, in time order. Create what must not be counted (the model, its optimizer
    states) before the block; free nothing inside it that was allocated before (see the module's
    docstring).

    Returns:
        an `Allocations`, filled when the block ends.

    Example:
        >>> with track_allocations() as allocated:  # doctest: +SKIP
        ...     model(**batch).loss.backward()
        >>> allocated.peak  # doctest: +SKIP
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    allocations = Allocations()
    gc.collect()  # garbage made before the block (tensors in reference cycles) would be freed unseen inside it
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield allocations
    # each event's nbytes is + for an allocation, - for a free; a stable sort keeps the order of
    # events stamped with the same nanosecond
    events = sorted(
        (
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
        ),
        key=lambda event: event[0],
    )
    level = 0
    for _, nbytes in events:
        level += nbytes
        allocations.peak = max(allocations.peak, level)
    allocations.end, allocations.events = level, len(events)
