"""PyTorch's CUDA caching allocator, replayed over a model's allocations in execution order.

What a PyTorch process holds on the GPU is not the peak of its live tensors but the peak of the
segments its caching allocator reserved with ``cudaMalloc``: a request of up to 1 MiB takes a piece
of a 2 MiB segment, one of 1-10 MiB a piece of a 20 MiB segment, a larger one a segment of its own
rounded up to 2 MiB; a freed block is kept and reused only for a request that fits in it, and merges
only with free neighbours of its own segment. So the same live bytes cost more or less depending on
the sizes and the order in which tensors come and go: on the harness's H100 records the peak reserved
is 1.1-1.5 times the peak allocated, in a way no constant factor follows. Replaying the allocator's
rules on the graph's allocations gives it.

The rules and constants are those of ``c10/cuda/CUDACachingAllocator.cpp`` in PyTorch 2.x with its
default settings (no ``expandable_segments``, no ``max_split_size_mb``, one stream): sizes rounded up
to 512 bytes; best fit among the free blocks of the request's pool (the smallest block that is big
enough, then the lowest address); the remainder of a block split off when it is at least 512 bytes
(small pool) or more than 1 MiB (large pool), else the request gets the whole block.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

import numpy as np

MIB = 2**20
MIN_BLOCK = 512  # kMinBlockSize: every size is rounded up to this
SMALL_REQUEST = 1 * MIB  # kSmallSize: requests up to this come from the small pool
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer: the small pool's segments
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer: segment for requests of 1-10 MiB
MIN_OWN_SEGMENT = 10 * MIB  # kMinLargeAlloc: from here a request gets a segment of its own
LARGE_ROUNDING = 2 * MIB  # kRoundLarge: ... rounded up to this


def segment_size(size: int) -> int:
    """Bytes of the segment ``cudaMalloc`` reserves for a request of ``size`` bytes that no cached block fits.

    >>> segment_size(4096) // MIB, segment_size(5 * MIB) // MIB, segment_size(11 * MIB + 1) // MIB
    (2, 20, 12)
    """
    if size <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if size < MIN_OWN_SEGMENT:
        return LARGE_SEGMENT
    return -(-size // LARGE_ROUNDING) * LARGE_ROUNDING


class _Block:
    __slots__ = ("size", "segment", "offset", "free", "prev", "next", "small")

    def __init__(self, size: int, segment: int, offset: int, small: bool,
                 prev: _Block | None = None, next: _Block | None = None):
        self.size, self.segment, self.offset, self.small = size, segment, offset, small
        self.free, self.prev, self.next = True, prev, next


class CachingAllocator:
    """The allocator's bookkeeping without the memory: blocks, segments, the reserved peak.

    It is written for speed, since a prediction replays about a thousand requests.

    >>> allocator = CachingAllocator()
    >>> allocator.free(allocator.malloc(1000))
    >>> allocator.peak_allocated, allocator.reserved // MIB
    (1024, 2)
    """

    def __init__(self) -> None:
        # free blocks per pool (small or not) as (size, segment, offset, block), sorted: best fit is a
        # bisection, and (size, segment, offset) is unique, so the block itself is never compared
        self._pools: dict[bool, list[tuple[int, int, int, _Block]]] = {True: [], False: []}
        self._segments = 0
        self.reserved = self.peak_reserved = self.allocated = self.peak_allocated = 0

    def reserve(self, requests: Iterable[float]) -> None:
        """``malloc`` each request that is not empty, for tensors never freed (weights, inputs), into a
        new allocator: the same segments, free blocks and counts, faster. Before anything is freed,
        every free block is the tail of its segment after blocks that stay allocated, so a free block
        needs no neighbours and an allocated one no block at all."""
        if self._segments:
            raise RuntimeError("reserve() is for an allocator nothing was allocated from yet")
        pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        segments = reserved = allocated = 0
        for nbytes in requests:
            if nbytes <= 0:
                continue
            size = -(-int(nbytes) // MIN_BLOCK) * MIN_BLOCK or MIN_BLOCK
            small = size <= SMALL_REQUEST
            pool = pools[small]
            i = bisect_left(pool, (size,))
            if i < len(pool):
                block_size, segment, offset = pool.pop(i)
            else:
                segments += 1
                block_size, segment, offset = segment_size(size), segments, 0
                reserved += block_size
            rest = block_size - size
            if rest >= MIN_BLOCK if small else rest > SMALL_REQUEST:
                insort(pool, (rest, segment, offset + size))
                block_size = size
            allocated += block_size
        self._pools = {small: [(*key, _Block(*key, small)) for key in pool] for small, pool in pools.items()}
        self._segments, self.reserved, self.allocated = segments, reserved, allocated
        self.peak_reserved, self.peak_allocated = reserved, allocated

    def malloc(self, nbytes: float) -> _Block:
        """A block of ``nbytes`` rounded up to 512: the best-fitting cached block, else a new segment."""
        size = -(-int(nbytes) // MIN_BLOCK) * MIN_BLOCK or MIN_BLOCK
        small = size <= SMALL_REQUEST
        pool = self._pools[small]
        i = bisect_left(pool, (size,))
        if i < len(pool):
            block = pool.pop(i)[3]
        else:
            segment = segment_size(size)
            self._segments += 1
            block = _Block(segment, self._segments, 0, small)
            self.reserved += segment
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_REQUEST:
            tail = _Block(rest, block.segment, block.offset + size, small, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            insort(pool, (rest, tail.segment, tail.offset, tail))
        block.free = False
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free(self, block: _Block) -> None:
        """Cache ``block`` for reuse, merged with free neighbours of its segment; nothing is returned to CUDA."""
        self.allocated -= block.size
        block.free = True
        pool = self._pools[block.small]  # a segment's blocks share its pool
        before, after = block.prev, block.next
        if before is not None and before.free:
            del pool[bisect_left(pool, (before.size, before.segment, before.offset))]
            before.size += block.size
            before.next = after
            if after is not None:
                after.prev = before
            block = before
        if after is not None and after.free:
            del pool[bisect_left(pool, (after.size, after.segment, after.offset))]
            block.size += after.size
            block.next = after.next
            if after.next is not None:
                after.next.prev = block
        insort(pool, (block.size, block.segment, block.offset, block))


def replay(resident: Iterable[float], outputs: np.ndarray, free_step: np.ndarray, casts: np.ndarray,
           workspace: np.ndarray) -> CachingAllocator:
    """The allocator after the resident tensors (workspace, weights, inputs: allocated first, never
    freed) and one forward pass, in eager's order: operator i makes the cast copies of its inputs,
    ``casts[i]``, allocates ``outputs[i]`` bytes (where ``free_step[i] >= 0``), then its workspace,
    ``workspace[i]``, and frees the copies and the workspace when it ends; an output is freed after
    the operator ``free_step`` names. ``casts[i]`` and ``workspace[i]`` are a size or a row of sizes,
    one per tensor, allocated in turn: how big each tensor is decides which cached block it fits."""
    allocator = CachingAllocator()
    allocator.reserve(resident)
    owns = (free_step >= 0) & (outputs > 0)
    owned = np.flatnonzero(owns)
    order = owned[np.argsort(free_step[owned], kind="stable")]
    ends = np.searchsorted(free_step[order], np.arange(len(outputs) + 1)).tolist()
    held: dict[int, _Block] = {}
    freed_by = order.tolist()
    copies_of, scratch_of = _tensors(casts), _tensors(workspace)
    malloc, free = allocator.malloc, allocator.free
    for i, (owner, size) in enumerate(zip(owns.tolist(), outputs.tolist())):
        copies = copies_of.get(i)
        temporaries = [malloc(b) for b in copies] if copies else ()
        if owner:
            held[i] = malloc(size)
        scratch = scratch_of.get(i)
        if scratch:
            for block in [malloc(b) for b in scratch]:
                free(block)
        for block in temporaries:
            free(block)
        for j in freed_by[ends[i]:ends[i + 1]]:
            free(held.pop(j))
    return allocator


def _tensors(sizes: np.ndarray) -> dict[int, tuple[float, ...]]:
    """The sizes of each operator's tensors that are not empty, for the operators that have some (few do);
    ``sizes`` holds one size per operator or a row of them."""
    rows = np.asarray(sizes, dtype=np.float64)
    if rows.ndim == 1:
        rows = rows[:, None]
    some = np.flatnonzero((rows > 0).any(axis=1))
    return {i: tuple(b for b in row if b > 0) for i, row in zip(some.tolist(), rows[some].tolist())}
