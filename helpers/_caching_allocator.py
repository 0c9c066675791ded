"""torch.cuda's caching allocator, replayed on a CPU allocation trace: what a card would reserve.

No notebook calls it: `helpers._cpu_peak.track_allocations` replays what torch's CPU allocator did
through it (`Allocations.reserved`), and scripts/bench_estimator.py --allocator and
tests/test_estimate_allocator.py hold the estimator's `reserved` (`helpers.estimate`, taught in
notebook 01) to it. Pure Python.

The policy is PyTorch's (c10/cuda/CUDACachingAllocator.cpp, no expandable segments, the default):
a request is rounded up to 512 bytes; up to 1 MiB it is served from the small pool, in 2 MiB
segments; larger ones from the large pool, in 20 MiB segments below 10 MiB and otherwise in a
segment of their own rounded up to 2 MiB. A request takes the smallest cached free block of its
pool that is large enough (best fit), split when what is left is worth keeping (512 bytes in the
small pool, more than 1 MiB in the large one); a freed block merges with its free neighbours in
its segment. Segments are never given back (no empty_cache, no out-of-memory retry), so the
reserved bytes only grow: their peak is torch.cuda.max_memory_reserved.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

__all__ = ["KIB", "CachingAllocator", "reserved_peak", "round_size", "segment_size"]

KIB = 1024
MIN_BLOCK = 512  # every request is rounded up to a multiple of this
SMALL_SIZE = 1024 * KIB  # requests up to this come from the small pool
SMALL_SEGMENT = 2 * 1024 * KIB  # the small pool's segments
LARGE_SEGMENT = 20 * 1024 * KIB  # the large pool's segments for requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * 1024 * KIB
ROUND_LARGE = 2 * 1024 * KIB  # a larger request gets a segment of its own, rounded up to this


def round_size(nbytes: int) -> int:
    """The bytes a request takes: a multiple of 512, at least 512."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    """The bytes cudaMalloc is asked for when no cached block fits a request of `size` (rounded)."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = False


class CachingAllocator:
    """The allocator's state: segments, blocks, and the free blocks of each pool by size."""

    def __init__(self):
        self.reserved = 0
        self.peak_reserved = 0
        self.blocks: dict[int, dict[int, _Block]] = {}  # segment -> offset -> block
        self.free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small? -> (size, segment, offset)
        self.live: dict[object, _Block] = {}  # the caller's handle -> the block it holds
        self.small: dict[int, bool] = {}  # segment -> whether it belongs to the small pool

    def malloc(self, handle, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.free[small]
        i = bisect_left(pool, (size, -1, -1))
        if i < len(pool):  # best fit: the smallest cached block that is large enough
            _, segment, offset = pool.pop(i)
            block = self.blocks[segment][offset]
        else:
            segment = len(self.blocks)
            block = _Block(segment, 0, segment_size(size))
            self.blocks[segment] = {0: block}
            self.small[segment] = small
            self.reserved += block.size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:  # split off what is worth keeping
            block.size = size
            self._cache(_Block(block.segment, block.offset + size, rest, free=True))
        block.free = False
        self.live[handle] = block

    def release(self, handle) -> None:
        """Free the block `handle` holds (unknown handles were allocated before the trace: ignored)."""
        block = self.live.pop(handle, None)
        if block is None:
            return
        blocks = self.blocks[block.segment]
        after = blocks.get(block.offset + block.size)
        if after is not None and after.free:  # merge with the free block that follows
            self._uncache(after)
            block.size += after.size
        before = next((b for b in blocks.values() if b.free and b.offset + b.size == block.offset), None)
        if before is not None:  # and with the one that precedes it
            self._uncache(before)
            del blocks[block.offset]
            before.size += block.size
            block = before
        self._cache(block)

    def _cache(self, block: _Block) -> None:
        block.free = True
        self.blocks[block.segment][block.offset] = block
        insort(self.free[self.small[block.segment]], (block.size, block.segment, block.offset))

    def _uncache(self, block: _Block) -> None:
        del self.blocks[block.segment][block.offset]
        pool = self.free[self.small[block.segment]]
        pool.pop(bisect_left(pool, (block.size, block.segment, block.offset)))


def reserved_peak(trace) -> int:
    """Peak bytes reserved replaying `trace`: (handle, nbytes) pairs in time order, nbytes > 0 an
    allocation, < 0 the free of the handle's block."""
    allocator = CachingAllocator()
    for handle, nbytes in trace:
        if nbytes > 0:
            allocator.malloc(handle, nbytes)
        elif nbytes < 0:
            allocator.release(handle)
    return allocator.peak_reserved
