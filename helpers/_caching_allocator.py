"""torch.cuda's caching allocator, replayed on a trace of requests: what a card would reserve.

No notebook calls it directly: `helpers._cpu_peak.track_allocations` replays what torch's CPU
allocator did through it (`Allocations.reserved`), `helpers.estimate.estimate_run_memory` (notebook
03) replays a whole run's modelled requests through it, and scripts/bench_estimator.py --allocator,
tests/test_estimate_allocator.py and tests/test_estimate_run.py hold the estimator to it. Pure Python.

The policy is PyTorch's (c10/cuda/CUDACachingAllocator.cpp). A request is rounded up to 512 bytes;
up to 1 MiB it is served from the small pool, larger ones from the large pool. A request takes the
smallest cached free block of its pool that is large enough (best fit), split when what is left is
worth keeping; a freed block merges with its free neighbours.

- Default segments: the small pool gets 2 MiB segments; the large pool 20 MiB segments for requests
  below 10 MiB and otherwise a segment of its own rounded up to 2 MiB. A large block is split only
  when more than 1 MiB is left. Segments stay cached: a later, larger request cannot use a freed
  smaller one, so a run whose shapes vary reserves more than its largest step allocates.
- Expandable segments (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`): one segment a pool, whose
  mapped pages grow at its end (2 MiB pages for the small pool, 20 MiB for the large one), a free
  block at the end growing with them; every block splits down to 512 bytes.
- A card's capacity: when a new segment (or page) would pass it, the allocator first gives back its
  cached segments that hold no live block (release_cached_blocks; expandable: the free pages at the
  end), then tries again; only then is it out of memory (`OutOfMemory`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

__all__ = ["KIB", "CachingAllocator", "OutOfMemory", "reserved_peak", "round_size", "segment_size"]

KIB = 1024
MIN_BLOCK = 512  # every request is rounded up to a multiple of this
SMALL_SIZE = 1024 * KIB  # requests up to this come from the small pool
SMALL_SEGMENT = 2 * 1024 * KIB  # the small pool's segments (and expandable pages)
LARGE_SEGMENT = 20 * 1024 * KIB  # the large pool's segments for requests below MIN_LARGE_ALLOC (and expandable pages)
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


class OutOfMemory(MemoryError):
    """A request the card could not serve even after the allocator gave back its cached segments."""

    def __init__(self, requested: int, reserved: int, allocated: int, capacity: int):
        self.requested, self.reserved, self.allocated, self.capacity = requested, reserved, allocated, capacity
        super().__init__(
            f"out of memory: {requested:,} bytes requested with {allocated:,} allocated and {reserved:,} reserved "
            f"of a {capacity:,}-byte card"
        )


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = False


class CachingAllocator:
    """The allocator's state: segments, blocks, and the free blocks of each pool by size.

    capacity: the bytes the allocator may reserve (a card's memory less what the CUDA context and
    libraries hold), or None for no limit. expandable: expandable segments instead of the default."""

    def __init__(self, capacity: int | None = None, expandable: bool = False):
        self.capacity, self.expandable = capacity, expandable
        self.reserved = self.peak_reserved = self.allocated = self.peak_allocated = 0
        self.blocks: dict[int, dict[int, _Block]] = {}  # segment -> offset -> block
        self.free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small? -> (size, segment, offset)
        self.live: dict[object, _Block] = {}  # the caller's handle -> the block it holds
        self.small: dict[int, bool] = {}  # segment -> whether it belongs to the small pool
        self.mapped: dict[int, int] = {}  # segment -> its bytes (an expandable segment's grow)
        self.free_ends: dict[tuple[int, int], _Block] = {}  # (segment, where a free block ends) -> the block
        self._next_segment = 0

    def malloc(self, handle, nbytes: int) -> None:
        if nbytes <= 0:  # nothing requested: nothing taken (a term that is 0 for this job)
            return
        if handle in self.live:  # an address handed out again: its block was freed where the trace did not look
            self.release(handle)
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._cached(size, small) or self._grow(size, small)
        rest = block.size - size
        if rest >= MIN_BLOCK if small or self.expandable else rest > SMALL_SIZE:  # split off what is worth keeping
            block.size = size
            self._cache(_Block(block.segment, block.offset + size, rest))
        block.free = False
        self.live[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def release(self, handle) -> None:
        """Free the block `handle` holds (unknown handles were allocated before the trace: ignored)."""
        block = self.live.pop(handle, None)
        if block is None:
            return
        self.allocated -= block.size
        blocks = self.blocks[block.segment]
        after = blocks.get(block.offset + block.size)
        if after is not None and after.free:  # merge with the free block that follows
            self._uncache(after)
            del blocks[after.offset]
            block.size += after.size
        before = self.free_ends.get((block.segment, block.offset))
        if before is not None:  # and with the one that precedes it
            self._uncache(before)
            del blocks[block.offset]
            before.size += block.size
            block = before
        self._cache(block)

    def _cached(self, size: int, small: bool) -> _Block | None:
        """The smallest cached free block of the pool that holds `size`, taken out of the cache."""
        pool = self.free[small]
        i = bisect_left(pool, (size, -1, -1))
        if i == len(pool):
            return None
        _, segment, offset = pool[i]
        block = self.blocks[segment][offset]
        self._uncache(block)
        return block

    def _grow(self, size: int, small: bool) -> _Block:
        """Reserve more memory for a request no cached block holds; at the capacity, give the cache back first."""
        for attempt in range(2):
            needed = self._expansion(size, small) if self.expandable else segment_size(size)
            if self.capacity is None or self.reserved + needed <= self.capacity:
                break
            if attempt == 0:
                self.release_cached()
        else:
            raise OutOfMemory(size, self.reserved, self.allocated, self.capacity)
        self.reserved += needed
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if not self.expandable:
            return self._new_segment(small, needed)
        segment = self._pool_segment(small)
        tail = self._tail(segment)
        if tail is None:
            tail = _Block(segment, self.mapped[segment], 0)
            self.blocks[segment][tail.offset] = tail
        else:
            self._uncache(tail)
        tail.size += needed
        self.mapped[segment] += needed
        return tail

    def _expansion(self, size: int, small: bool) -> int:
        """Bytes of pages an expandable segment maps so that its free end holds `size`."""
        page = SMALL_SEGMENT if small else LARGE_SEGMENT
        segment = self._segment_of(small)
        tail = self._tail(segment) if segment is not None else None
        short = size - (tail.size if tail is not None else 0)
        return -(-short // page) * page

    def _new_segment(self, small: bool, nbytes: int) -> _Block:
        segment = self._next_segment
        self._next_segment += 1
        block = _Block(segment, 0, nbytes)
        self.blocks[segment] = {0: block}
        self.small[segment], self.mapped[segment] = small, nbytes
        return block

    def _segment_of(self, small: bool) -> int | None:
        return next((s for s, is_small in self.small.items() if is_small == small), None)

    def _pool_segment(self, small: bool) -> int:
        segment = self._segment_of(small)
        if segment is None:
            segment = self._new_segment(small, 0).segment
            del self.blocks[segment][0]
        return segment

    def _tail(self, segment: int) -> _Block | None:
        """The free block that ends where the segment's mapped memory ends, if there is one."""
        return self.free_ends.get((segment, self.mapped[segment]))

    def release_cached(self) -> None:
        """Give back what holds no live block: whole free segments; an expandable segment's free pages at its end."""
        for segment in list(self.blocks):
            tail = self._tail(segment)
            if tail is None:
                continue
            if self.expandable:  # the whole pages inside the free end
                page = SMALL_SEGMENT if self.small[segment] else LARGE_SEGMENT
                unmapped = self.mapped[segment] - -(-tail.offset // page) * page
                if unmapped > 0:
                    self._uncache(tail)
                    tail.size -= unmapped
                    self.mapped[segment] -= unmapped
                    self.reserved -= unmapped
                    if tail.size:
                        self._cache(tail)
                    else:
                        del self.blocks[segment][tail.offset]
            elif tail.offset == 0:  # the whole segment is one free block
                self._uncache(tail)
                self.reserved -= self.mapped.pop(segment)
                del self.blocks[segment], self.small[segment]

    def _cache(self, block: _Block) -> None:
        block.free = True
        self.blocks[block.segment][block.offset] = block
        self.free_ends[block.segment, block.offset + block.size] = block
        insort(self.free[self.small[block.segment]], (block.size, block.segment, block.offset))

    def _uncache(self, block: _Block) -> None:
        """Take a free block out of the free lists (it stays in its segment)."""
        block.free = False
        del self.free_ends[block.segment, block.offset + block.size]
        pool = self.free[self.small[block.segment]]
        pool.pop(bisect_left(pool, (block.size, block.segment, block.offset)))


def reserved_peak(trace, expandable: bool = False) -> int:
    """Peak bytes reserved replaying `trace`: (handle, nbytes) pairs in time order, nbytes > 0 an
    allocation, < 0 the free of the handle's block."""
    allocator = CachingAllocator(expandable=expandable)
    for handle, nbytes in trace:
        if nbytes > 0:
            allocator.malloc(handle, nbytes)
        elif nbytes < 0:
            allocator.release(handle)
    return allocator.peak_reserved
