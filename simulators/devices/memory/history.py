"""What a mock device's books did over a run: a bounded timeline for the dry-run report, and, when asked, the allocation
history in the format of ``torch.cuda.memory._snapshot()``.

Rules (:class:`simulators.devices.memory.books.DeviceMemory` keeps one of each per device of a rank whose dry run asked for
memory reports, resp. for a memory snapshot):

- :class:`Timeline`: after each change of the books (a storage booked, resized or released, ``empty_cache``) the
  device's allocated and reserved bytes, numbered by the change (the event index, from 1). Every change is kept up to
  ``CAP`` points; past that, neighbouring points merge in pairs and the changes that follow are kept one per bucket of
  as many changes: a point holds its bucket's most allocated (at that change's index) and most reserved bytes, so
  the curve is the run's upper envelope at a resolution of ``CAP`` points. The peak (the change where the device
  reached the peak the books report) is kept apart and exactly. The optimizer steps are marks: the event index where
  step ``s`` (1 + the optimizer steps completed) began;
- :class:`AllocationHistory`: torch's trace entries, as ``_record_memory_history()`` records them on a GPU: ``alloc``
  (the block's address from the caching-allocator model, the bytes asked), ``free_requested`` then ``free_completed``
  (one stream: a free completes at once), the model's ``segment_alloc`` / ``segment_free`` (``segment_map`` /
  ``segment_unmap`` with expandable segments) and ``oom``; each with the frames of the user's script on the stack
  (innermost first) where it has some, else the innermost statement outside torch and the simulator. The last
  ``MAX_ENTRIES`` entries are kept (torch's ring buffer);
- :func:`snapshot`: a device family's ``{"segments": [...], "device_traces": [...]}`` as ``torch.cuda.memory._snapshot()``
  returns it: per segment of the model (a cudaMalloc'd segment, or a mapped range of an expandable one) its blocks in
  address order, each allocated one with the bytes asked and the frames of the allocation that holds it.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

#: The most points a device's timeline keeps (then pairs merge: see the module docstring).
CAP = 4096
#: The most step marks a timeline keeps (then every other one is dropped).
STEP_CAP = 1024
#: The most trace entries an allocation history keeps per device (the oldest go first, as in torch's ring buffer).
MAX_ENTRIES = 1_000_000


class Timeline:
    """One device's allocated and reserved bytes after each change of its books (bounded; see the module docstring)."""

    __slots__ = ("points", "steps", "events", "stride", "peak", "_pending", "_left")

    def __init__(self) -> None:
        self.points: list[tuple[int, int, int]] = []
        self.steps: list[tuple[int, int]] = []
        self.events = 0
        self.stride = 1
        #: (event, allocated, reserved) where the books' peak was reached.
        self.peak: tuple[int, int, int] | None = None
        self._pending: tuple[int, int, int] | None = None
        self._left = 0

    def add(self, allocated: int, reserved: int) -> None:
        """Count a change of the books that leaves ``allocated`` and ``reserved`` bytes."""
        self.events += 1
        if self.stride == 1:
            self.points.append((self.events, allocated, reserved))
            if len(self.points) >= CAP:
                self._halve()
            return
        pending = self._pending
        if pending is None:
            pending, self._left = (self.events, allocated, reserved), self.stride
        elif allocated > pending[1] or reserved > pending[2]:
            pending = (self.events, allocated, reserved) if allocated >= pending[1] else (pending[0], pending[1], reserved)
        self._left -= 1
        if self._left:
            self._pending = pending
            return
        self._pending = None
        self.points.append(pending)
        if len(self.points) >= CAP:
            self._halve()

    def peaked(self, allocated: int, reserved: int) -> None:
        """The change just counted is the books' peak."""
        self.peak = (self.events, allocated, reserved)

    def step(self, step: int) -> None:
        """Optimizer step ``step`` begins after the changes counted so far."""
        if self.steps and self.steps[-1][0] == self.events:
            self.steps[-1] = (self.events, step)
        else:
            self.steps.append((self.events, step))
        if len(self.steps) > STEP_CAP:
            self.steps = self.steps[::2]

    def _halve(self) -> None:
        points, merged = self.points, []
        for i in range(0, len(points) - 1, 2):
            a, b = points[i], points[i + 1]
            event, allocated = (a[0], a[1]) if a[1] >= b[1] else (b[0], b[1])
            merged.append((event, allocated, max(a[2], b[2])))
        if len(points) % 2:
            merged.append(points[-1])
        self.points, self.stride = merged, self.stride * 2

    def report(self) -> dict[str, Any]:
        """The timeline as the rank's memory report writes it (lists of ``[event, allocated, reserved]`` and
        ``[event, step]``)."""
        points = self.points + ([self._pending] if self._pending is not None else [])
        return {"events": self.events, "stride": self.stride, "points": [list(point) for point in points],
                "steps": [list(mark) for mark in self.steps], "peak": list(self.peak) if self.peak else None}


class _Ring(deque):
    """The trace entries' ring: an entry the caching-allocator model appends (``(action, address, size)``) gets the
    frames and time of the allocation it serves."""

    def __init__(self, frames: Callable[[], list[dict[str, Any]]]) -> None:
        super().__init__(maxlen=MAX_ENTRIES)
        self.frames = frames

    def append(self, entry: tuple) -> None:
        if len(entry) == 3:
            entry = (*entry, self.frames(), time.time_ns() // 1000)
        super().append(entry)


class AllocationHistory:
    """One device's trace entries (``(action, addr, size, frames, time_us[, device_free])``); the caching-allocator
    model appends its segment actions to the same ring (``(action, addr, size)``)."""

    __slots__ = ("entries", "frames")

    def __init__(self, frames: Callable[[], list[dict[str, Any]]]) -> None:
        self.entries: deque[tuple] = _Ring(frames)
        self.frames = frames

    def alloc(self, addr: int, size: int) -> list[dict[str, Any]]:
        """Record an allocation of ``size`` bytes at ``addr``; its frames (kept with the block: a snapshot's blocks
        carry them)."""
        frames = self.frames()
        self.entries.append(("alloc", addr, size, frames, time.time_ns() // 1000))
        return frames

    def free(self, addr: int, size: int, frames: list[dict[str, Any]] | None) -> None:
        now = time.time_ns() // 1000
        self.entries.append(("free_requested", addr, size, frames or [], now))
        self.entries.append(("free_completed", addr, size, frames or [], now))

    def out_of_memory(self, size: int, device_free: int) -> None:
        self.entries.append(("oom", 0, size, self.frames(), time.time_ns() // 1000, device_free))


def _trace_entry(entry: tuple) -> dict[str, Any]:
    action, addr, size, frames, when = entry[:5]
    found = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames, "time_us": when}
    if action == "oom":
        del found["addr"]
        found["device_free"] = entry[5]
    return found


def snapshot(devices: dict[int, tuple[Any, AllocationHistory | None, dict[int, tuple[Any, int, list]]]]) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()``'s dictionary of a rank's devices: per device index, its caching-allocator
    model (None without one), its allocation history (None when none was kept) and its allocated blocks, each by
    address: the model's block, the bytes asked and the frames of the allocation."""
    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(devices, default=-1) + 1)]
    for index, (allocator, history, allocated) in sorted(devices.items()):
        if history is not None:
            traces[index] = [_trace_entry(entry) for entry in list(history.entries)]
        if allocator is not None:
            segments += _segments(index, allocator, allocated)
    return {"segments": segments, "device_traces": traces}


def _segments(index: int, allocator: Any, allocated: dict[int, tuple[Any, int, list]]) -> list[dict[str, Any]]:
    """The model's segments on device ``index``: each chain of blocks (a cudaMalloc'd segment), or each mapped run of
    an expandable segment's chain, in address order."""
    known = [block for pool in (allocator.small, allocator.large) for block in (*pool.free.values(), *pool.unmapped.values())]
    known += [block for block, _, _ in allocated.values()]
    heads: dict[int, Any] = {}
    for block in known:
        while block.prev is not None:
            block = block.prev
        heads[id(block)] = block
    segments = []
    for head in sorted(heads.values(), key=lambda block: block.addr):
        run: list[Any] = []
        block = head
        while block is not None:
            if block.mapped:
                run.append(block)
            elif run:
                segments.append(_segment(index, run, allocated))
                run = []
            block = block.next
        if run:
            segments.append(_segment(index, run, allocated))
    return segments


def _segment(index: int, run: list[Any], allocated: dict[int, tuple[Any, int, list]]) -> dict[str, Any]:
    blocks = []
    for block in run:
        _, asked, frames = allocated.get(block.addr, (block, block.size, [])) if block.allocated else (block, 0, [])
        blocks.append({"address": block.addr, "size": block.size, "requested_size": asked,
                       "state": "active_allocated" if block.allocated else "inactive", "frames": frames})
    used = sum(block["size"] for block in blocks if block["state"] == "active_allocated")
    return {"device": index, "address": run[0].addr, "total_size": sum(block.size for block in run), "stream": run[0].stream,
            "segment_type": "small" if run[0].pool.small else "large", "segment_pool_id": (0, 0),
            "allocated_size": used, "active_size": used, "requested_size": sum(block["requested_size"] for block in blocks),
            "is_expandable": run[0].segment is not None, "blocks": blocks}
