"""A model of torch's CUDA caching allocator: which segments a device reserves for a sequence of allocations and frees.

One :class:`CachingAllocator` per device replays what ``DeviceCachingAllocator`` (c10/cuda/CUDACachingAllocator.cpp,
torch 2.11; constants and settings in c10/core/AllocatorConfig.{h,cpp}) does with sizes and addresses, without memory:

- a request of ``n`` bytes (0 bytes asks nothing: ``NativeCachingAllocator::allocate``) is rounded up to a multiple of
  512 (``kMinBlockSize``; ``round_size``); rounded sizes up to 1 MiB (``kSmallSize``) come from the small pool, larger
  ones from the large pool (``get_pool``);
- a free cached block is looked for first (``get_free_block``): the smallest free block of the pool on the same stream
  that holds the size, the lowest address among equal sizes (``BlockComparatorSize``: stream, size, address). With
  ``max_split_size`` set, a request below it takes no block of that size or more, and a request of that size or more
  takes no block ``max_non_split_rounding_size`` (20 MiB) or more larger than itself;
- with none, a new segment is cudaMalloc'd (``alloc_block``) of ``get_allocation_size``: 2 MiB (``kSmallBuffer``) for
  the small pool, 20 MiB (``kLargeBuffer``, ``large_segment_size``) for a request under 10 MiB (``kMinLargeAlloc``),
  else the request rounded up to 2 MiB (``kRoundLarge``); what a segment adds is reserved memory;
- a block larger than the request is split (``should_split``) when the rest is at least 512 bytes in the small pool
  (or with expandable segments), and in the large pool when the request is under ``max_split_size`` and the rest is
  more than 1 MiB; the allocated part keeps the lower addresses, the rest is a free block (``alloc_found_block``);
- a freed block goes back to its pool, merged with its free neighbours in the segment (``free_block``,
  ``try_merge_blocks``); nothing is returned to the device;
- when cudaMalloc fails (the device's capacity, here the budget, would be passed), oversize cached blocks are
  released if ``max_split_size`` is set (``release_available_cached_blocks``), then every fully free segment
  (``release_cached_blocks``), and the segment is asked again; then it is out of memory (``malloc``);
- ``empty_cache`` releases every fully free segment (``emptyCache`` -> ``release_blocks``) and, with expandable
  segments, unmaps the whole free pages of free blocks;
- ``expandable_segments:True`` (``Note [Expandable Segments]``): one segment per stream and pool, a reserved address
  range of 9/8 of the device's memory mapped in pages of 2 MiB (small pool) or 20 MiB (large pool,
  ``large_segment_size``) as needed; an allocation that no free block holds maps pages at the lowest address where
  free and unmapped space together hold it (``find_expandable_block``, ``map_block``), each page adding reserved
  memory; best fit counts a free block at the end of the mapped part as large as it can grow;
- ``PYTORCH_ALLOC_CONF`` (else ``PYTORCH_CUDA_ALLOC_CONF``) sets ``max_split_size_mb`` (at least 20),
  ``max_non_split_rounding_mb`` and ``expandable_segments`` (:meth:`Settings.from_env`); ``garbage_collection_threshold``
  acts only under ``set_per_process_memory_fraction`` and ``roundup_power2_divisions`` is not modelled.

Streams are numbers (the mock runs everything on stream 0); events and graph pools are not modelled.
"""
from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import Callable, Mapping

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize
SMALL_BUFFER = 2 << 20  # kSmallBuffer
LARGE_BUFFER = 20 << 20  # kLargeBuffer (AcceleratorAllocatorConfig::large_segment_size's default)
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
UNLIMITED = 2**64 - 1  # max_split_size's default: std::numeric_limits<size_t>::max()
MB = 1 << 20
#: The device memory an expandable segment's address range is sized for when the device has no capacity.
DEFAULT_TOTAL = 64 << 30


class AllocatorOutOfMemory(Exception):
    """cudaMalloc of ``size`` bytes failed even after releasing the cache: the capacity would be passed."""

    def __init__(self, size: int, allocator: "CachingAllocator") -> None:
        super().__init__(f"cannot reserve {size} more bytes")
        self.size, self.reserved, self.allocated = size, allocator.reserved, allocator.allocated


@dataclass(frozen=True)
class Settings:
    """The allocator settings that change what it reserves (``AcceleratorAllocatorConfig``)."""

    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = LARGE_BUFFER
    expandable_segments: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Settings":
        """The settings of ``PYTORCH_ALLOC_CONF``, else ``PYTORCH_CUDA_ALLOC_CONF`` (``AcceleratorAllocatorConfig::
        instance``): ``key:value`` pairs separated by commas; other keys are skipped. ValueError as torch refuses."""
        text = environ.get("PYTORCH_ALLOC_CONF", environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
        values: dict[str, int | bool] = {}
        for item in filter(None, (part.strip() for part in text.replace(" ", "").split(","))):
            key, _, value = item.partition(":")
            if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                if not value.isdigit() or int(value) < LARGE_BUFFER // MB:
                    raise ValueError(f"CachingAllocator option {key} too small, must be >= {LARGE_BUFFER // MB}")
                name = "max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"
                values[name] = min(int(value), UNLIMITED // MB) * MB
            elif key == "expandable_segments":
                if value not in ("True", "true", "False", "false"):
                    raise ValueError(f"Expected 'True' or 'False' for expandable_segments, got {value!r}")
                values["expandable_segments"] = value in ("True", "true")
        return cls(**values)  # type: ignore[arg-type]


class Block:
    """A range of a segment: allocated, free (in its pool) or, in an expandable segment, unmapped."""

    __slots__ = ("addr", "size", "stream", "allocated", "mapped", "prev", "next", "pool", "segment")

    def __init__(self, addr: int, size: int, stream: int, pool: "_Pool", segment: "_Expandable | None" = None) -> None:
        self.addr, self.size, self.stream, self.pool, self.segment = addr, size, stream, pool, segment
        self.allocated, self.mapped = False, True
        self.prev: Block | None = None
        self.next: Block | None = None

    def splice(self, before: "Block | None", after: "Block | None") -> None:
        """Put this block between ``before`` and ``after`` (``Block::splice``)."""
        if before is not None:
            before.next = self
        if after is not None:
            after.prev = self
        self.prev, self.next = before, after


class _Pool:
    """A ``BlockPool``: its free blocks sorted by (stream, size, address) and its unmapped ones by (stream, address)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.free: dict[int, Block] = {}
        self.unmapped_keys: list[tuple[int, int]] = []
        self.unmapped: dict[int, Block] = {}

    def insert(self, block: Block) -> None:
        if block.mapped:
            bisect.insort(self.keys, (block.stream, block.size, block.addr))
            self.free[block.addr] = block
        else:
            bisect.insort(self.unmapped_keys, (block.stream, block.addr))
            self.unmapped[block.addr] = block

    def remove(self, block: Block) -> None:
        if block.mapped:
            del self.keys[bisect.bisect_left(self.keys, (block.stream, block.size, block.addr))]
            del self.free[block.addr]
        else:
            del self.unmapped_keys[bisect.bisect_left(self.unmapped_keys, (block.stream, block.addr))]
            del self.unmapped[block.addr]


@dataclass
class _Expandable:
    """An ``ExpandableSegment``: its address range and page size."""

    base: int
    size: int
    page: int


def round_size(size: int) -> int:
    """``round_size``: at least 512 bytes, a multiple of 512."""
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a rounded request that no cached block holds."""
    return SMALL_BUFFER if size <= SMALL_SIZE else LARGE_BUFFER if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """One device's caching allocator (see the module docstring). ``capacity``: the bytes cudaMalloc may reserve in
    all (None: no limit); ``address``: where cudaMalloc puts a segment of a size (default: one after another)."""

    def __init__(self, settings: Settings | None = None, capacity: int | None = None,
                 address: Callable[[int], int] | None = None) -> None:
        self.settings = settings or Settings()
        self.capacity = capacity
        self.small, self.large = _Pool(True), _Pool(False)
        self.reserved = self.max_reserved = self.allocated = 0
        self._next_address = 1 << 40
        self._address = address or self._bump
        #: ("segment_alloc" | "segment_free" | "segment_map" | "segment_unmap", address, size) once set to a list (or a
        #: deque: :class:`simulators.devices.memory.history.AllocationHistory`'s ring).
        self.history: list[tuple[str, int, int]] | None = None

    # -- the allocator's API -------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        """The block that serves a request of ``nbytes`` (> 0); AllocatorOutOfMemory when none can be had."""
        size = round_size(nbytes)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._free_block(pool, size, stream)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None and self._release_available(pool, size, stream):
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None:
                self.empty_cache()
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None:
                raise AllocatorOutOfMemory(alloc_size, self)
        if self._should_split(block, size):
            used = Block(block.addr, size, stream, pool, block.segment)
            used.splice(block.prev, block)
            block.addr, block.size = block.addr + size, block.size - size
            pool.insert(block)
            block = used
        block.allocated = True
        self.allocated += block.size
        return block

    def free(self, block: Block) -> None:
        """Return ``block`` to its pool, merged with its free neighbours."""
        block.allocated = False
        self.allocated -= block.size
        self._merge(block, block.prev)
        self._merge(block, block.next)
        block.pool.insert(block)

    def empty_cache(self) -> None:
        """Release every fully free segment; unmap the free pages of expandable segments (``release_cached_blocks``)."""
        for pool in (self.large, self.small):
            to_unmap = []
            for _, _, addr in list(pool.keys):
                block = pool.free[addr]
                if block.segment is not None:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    pool.remove(block)
                    self._reserve(-block.size, "segment_free", block.addr)
            for block in to_unmap:
                self._unmap(block)
                if block.prev is None and block.next is None and not block.mapped:
                    pool.remove(block)  # the whole segment is unmapped: release it (release_expandable_segment)

    def reset_peak(self) -> None:
        """Start the reserved peak again from what is reserved now (``resetPeakStats``)."""
        self.max_reserved = self.reserved

    def restore_segment(self, address: int, size: int, small: bool, used: list[tuple[int, int]], stream: int = 0) -> list[Block]:
        """Take a segment cudaMalloc'd before (at ``address``, ``size`` bytes, in the small or large pool) whose
        allocated blocks are ``used`` (address, size); the rest of it is free. Returns the allocated blocks."""
        pool, pieces, at = (self.small if small else self.large), [], address
        for start, length in sorted(used):
            pieces += [(at, start - at, False)] if start > at else []
            pieces.append((start, length, True))
            at = start + length
        pieces += [(at, address + size - at, False)] if at < address + size else []
        blocks, previous = [], None
        for start, length, allocated in pieces:
            block = Block(start, length, stream, pool)
            block.splice(previous, None)
            block.allocated, previous = allocated, block
            if allocated:
                blocks.append(block)
                self.allocated += length
            else:
                pool.insert(block)
        self._reserve(size, None, address)
        return blocks

    # -- torch's private methods -------------------------------------------------------------------------------
    def _bump(self, size: int) -> int:
        address, self._next_address = self._next_address, self._next_address + -(-size // ROUND_LARGE) * ROUND_LARGE
        return address

    def _reserve(self, size: int, action: str | None, address: int) -> None:
        self.reserved += size
        self.max_reserved = max(self.max_reserved, self.reserved)
        if self.history is not None and action:
            self.history.append((action, address, abs(size)))

    def _fits(self, size: int) -> bool:
        return self.capacity is None or self.reserved + size <= self.capacity

    def _free_block(self, pool: _Pool, size: int, stream: int) -> Block | None:
        """``get_free_block``: the best-fitting free block on ``stream``, out of the pool; None when none fits."""
        keys, settings = pool.keys, self.settings
        i = bisect.bisect_left(keys, (stream, size, 0))
        if i == len(keys) or keys[i][0] != stream:
            return None
        block = pool.free[keys[i][2]]
        if block.segment is not None:
            if settings.expandable_segments:  # best fit counts a block as large as it can grow
                def growable(b: Block) -> int:
                    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
                while block.segment is not None and i + 1 < len(keys) and keys[i + 1][0] == stream:
                    following = pool.free[keys[i + 1][2]]
                    if growable(following) >= growable(block):
                        break
                    i, block = i + 1, following
            else:  # expandable segments turned off since: only other blocks
                i += 1
                while i < len(keys) and keys[i][0] == stream and pool.free[keys[i][2]].segment is not None:
                    i += 1
                if i == len(keys) or keys[i][0] != stream:
                    return None
                block = pool.free[keys[i][2]]
        if size < settings.max_split_size <= block.size:
            return None
        if size >= settings.max_split_size and block.size >= size + settings.max_non_split_rounding_size:
            return None
        pool.remove(block)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.small or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK
        return size < self.settings.max_split_size and remaining > SMALL_SIZE

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, stream: int) -> Block | None:
        """``alloc_block``: a new segment of ``alloc_size`` (or, expandable, pages mapped for ``size``); None when
        the capacity would be passed."""
        if self.settings.expandable_segments:
            return self._expandable_block(pool, size, stream)
        if not self._fits(alloc_size):
            return None
        block = Block(self._address(alloc_size), alloc_size, stream, pool)
        self._reserve(alloc_size, "segment_alloc", block.addr)
        return block

    def _release_available(self, pool: _Pool, size: int, stream: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, release the smallest oversize segment
        that holds the request, else the largest oversize ones until as much as asked is released."""
        limit = self.settings.max_split_size
        if limit == UNLIMITED:
            return False
        wanted, keys = max(size, limit), pool.keys
        i = bisect.bisect_left(keys, (stream, wanted, 0))
        if i < len(keys) and keys[i][0] == stream and pool.free[keys[i][2]].segment is None:
            block = pool.free[keys[i][2]]
            if block.prev is None and block.next is None:  # torch would cudaFree a split block's inner address
                self._release(block)
                return True
            return False
        released, i = 0, i - 1
        while released < wanted and i >= 0 and keys[i][0] == stream and keys[i][1] >= limit:
            block = pool.free[keys[i][2]]
            i -= 1
            if block.segment is None and block.prev is None and block.next is None:
                released += block.size
                self._release(block)
        return released >= wanted

    def _release(self, block: Block) -> None:
        """``release_block``: cudaFree a free segment (in torch, one that is not split cannot be released else)."""
        block.pool.remove(block)
        self._reserve(-block.size, "segment_free", block.addr)

    def _merge(self, dst: Block, src: Block | None) -> None:
        """``try_merge_blocks``: ``dst`` (out of any pool) takes in ``src`` when it is free and mapped alike."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        src.pool.remove(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- expandable segments -------------------------------------------------------------------------------------
    def _expandable_block(self, pool: _Pool, size: int, stream: int) -> Block | None:
        """``try_allocate_expandable_block``: map pages until a free block of ``size`` starts at the candidate."""
        candidate = self._find_expandable(pool, size, stream)
        if not candidate.mapped and not self._map(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None
            if not self._map(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _find_expandable(self, pool: _Pool, size: int, stream: int) -> Block:
        """``find_expandable_block``: the lowest address where free then unmapped blocks hold ``size``, else a new
        segment's whole unmapped range."""
        def free(b: Block | None) -> bool:
            return b is not None and not b.allocated

        i = bisect.bisect_left(pool.unmapped_keys, (stream, 0))
        while i < len(pool.unmapped_keys) and pool.unmapped_keys[i][0] == stream:
            start = pool.unmapped[pool.unmapped_keys[i][1]]
            start = start.prev if free(start.prev) else start
            room, block = 0, start
            while room < size and free(block):
                room, block = room + block.size, block.next
            if room >= size:
                return start
            i += 1
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        total = self.capacity or DEFAULT_TOTAL
        span = -(-(total + total // 8) // page) * page
        segment = _Expandable(self._address(span), span, page)
        candidate = Block(segment.base, span, stream, pool, segment)
        candidate.mapped = False
        pool.insert(candidate)
        return candidate

    def _map(self, block: Block, size: int) -> bool:
        """``map_block``: map the pages of ``block`` (unmapped) that hold its first ``size`` bytes; False past the
        capacity. The mapped part merges with free neighbours and joins the pool."""
        segment = block.segment
        assert segment is not None
        end = -(-(block.addr + size - segment.base) // segment.page) * segment.page + segment.base
        mapped = end - block.addr
        if not self._fits(mapped):
            return False
        block.pool.remove(block)
        block.mapped, start = True, block.addr
        if mapped < block.size:
            rest = Block(end, block.size - mapped, block.stream, block.pool, segment)
            rest.mapped = False
            rest.splice(block, block.next)
            block.pool.insert(rest)
            block.size = mapped
        self._merge(block, block.prev)
        self._merge(block, block.next)
        block.pool.insert(block)
        self._reserve(mapped, "segment_map", start)  # the pages mapped, not the free block they merged into
        return True

    def _unmap(self, block: Block) -> None:
        """``unmap_block``: unmap the whole pages of free ``block``; its parts before and after them stay free."""
        segment = block.segment
        assert segment is not None
        page, base = segment.page, segment.base
        begin = -(-(block.addr - base) // page) * page + base
        end = (block.addr + block.size - base) // page * page + base
        if begin >= end:
            return
        pool = block.pool
        pool.remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.stream, pool, segment)
            before.splice(block.prev, block)
            pool.insert(before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, block.stream, pool, segment)
            after.splice(block, block.next)
            pool.insert(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        pool.insert(block)
        self._reserve(-(end - begin), "segment_unmap", begin)
