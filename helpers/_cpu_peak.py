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
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

from helpers._caching_allocator import reserved_peak

__all__ = ["Allocations", "track_allocations"]


@dataclass
class Allocations:
    """What torch's CPU allocator did during a `track_allocations` block, in bytes above its level at entry."""

    peak: int = 0  # the most allocated at one moment
    end: int = 0  # allocated at exit (what the block left behind)
    events: int = 0  # allocations and frees seen
    reserved: int = 0  # the peak torch.cuda's caching allocator would reserve for the same requests


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
    from torch.profiler import ProfilerActivity, profile

    allocations = Allocations()
    gc.collect()  # garbage made before the block (tensors in reference cycles) would be freed unseen inside it
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        prof.start()
    try:
        yield allocations
    finally:
        with _quiet_stderr():
            prof.stop()
    # each event is an allocation (+bytes) or a free (-bytes) of one address; a stable sort keeps
    # the order of events stamped with the same nanosecond
    events = sorted(_memory_events(prof.profiler.kineto_results.experimental_event_tree()), key=lambda e: e[0])
    level = 0
    for _, _, nbytes in events:
        level += nbytes
        allocations.peak = max(allocations.peak, level)
    allocations.end, allocations.events = level, len(events)
    allocations.reserved = reserved_peak((ptr, nbytes) for _, ptr, nbytes in events)


def _memory_events(nodes) -> list[tuple[int, int, int]]:
    """(time in ns, address, signed bytes) of every CPU allocation and free in the profiler's event tree."""
    found, stack = [], list(reversed(nodes))  # depth first, in the tree's order
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation" and str(fields.device) == "cpu":
            found.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        stack.extend(reversed(node.children))
    return found


@contextmanager
def _quiet_stderr():
    """Send the process's stderr (file descriptor 2) to /dev/null for the block.

    torch's profiler (kineto, in C++) prints "USDT: ... profiler_start" and "profiler_stop" lines
    there each time it starts and stops, whatever KINETO_LOG_LEVEL says: noise in a notebook's output.
    Only the profiler's start and stop run inside this block, never the code being measured.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
