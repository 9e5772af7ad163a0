"""Memory of the mock devices: what each device holds, its peak, and out-of-memory past its budget.

Rules (the budget is :func:`simulators.devices.families.machine.device_memory`):

- a device holds the storages of the live tensors on it: a storage counts
  once, at its size in bytes, however many tensors (views, parameters, their
  ``.data``) share it, from when a tensor on the device first wraps it until
  the last of them dies (autograd's saved tensors keep theirs alive, as on
  hardware); an op that resizes it (``out=``, ``resize_``, the factories
  that fill an empty tensor) changes its size in the books, and so does a
  resize of the storage itself (``tensor.untyped_storage().resize_(0)``, how
  FSDP2 frees an unsharded parameter it still references);
- on ``cuda``, each device also runs a model of torch's caching allocator
  (:mod:`simulators.devices.memory.caching_allocator`, settings from the process's
  ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF``): a new storage is a
  malloc of its bytes, its release a free, a resize a malloc of the new size
  then a free of the old (torch's ``resize_bytes_cuda``; a resize to 0 bytes
  only frees); what the model's segments take is the device's reserved
  memory (``memory_reserved``), ``empty_cache`` releases its fully free
  segments, and ``mem_get_info`` counts reserved memory as used. The other
  families (``npu``, ``xla``) reserve what they hold;
- a new storage (or a resize) that would take a device past its budget raises torch's
  ``torch.OutOfMemoryError`` (what ``torch.cuda`` raises) naming the device,
  the size asked for, the budget, what is allocated and what is free; nothing
  is counted then. On ``cuda`` that is a segment the allocator model cannot
  reserve (its reserved memory plus the segment would pass the budget once
  its cache is released), as on a GPU;
- the peak is the most a device held since the process started or since
  :meth:`DeviceMemory.reset_peak`, and so is the peak of its reserved memory.

Each process keeps its own books: a rank is a machine of its own.

Catalog: the "Big-model inference" rows (``modeling.device_map``, ``bigmodel.dispatch_model``, ...).
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from simulators.devices.families import machine
from simulators.devices.memory.caching_allocator import AllocatorOutOfMemory, Block, CachingAllocator, Settings
from simulators.devices.memory.history import AllocationHistory, Timeline, snapshot


#: Where payloads live: the CPU, or nowhere (meta) in no-compute mode; a meta storage counts at its size as well.
_PAYLOAD_DEVICES = ("cpu", "meta")
#: The families whose devices run the caching allocator model.
CACHING_FAMILIES = ("cuda",)


def storage_key(payload: torch.Tensor) -> int:
    """How the books name the storage of ``payload`` (a mock tensor's CPU payload): the storage itself, not
    its data pointer, which a resize changes."""
    return payload.untyped_storage()._cdata


@dataclass
class _Storage:
    """One storage on a device: its size and the live tensors that wrap it."""

    size: int
    holders: int = 0
    #: Its block in the device's caching allocator model (None: no model, or 0 bytes).
    block: Block | None = None
    #: How many tensors on it autograd holds for backward (:mod:`simulators.devices.memory.activations`).
    saved: int = 0
    #: The frames of its allocation, where the device keeps an allocation history.
    frames: list | None = None


@dataclass
class _Device:
    allocated: int = 0
    peak: int = 0
    storages: dict[int, _Storage] = field(default_factory=dict)
    #: When and where the peak was reached, and what it held (see :mod:`simulators.devices.memory.peaks`).
    peak_step: int = 0
    peak_at: str = ""
    split: dict[str, int] | None = None
    split_at: int = 0
    split_step: int = -1
    #: The storages held at the last split and each part's keys then, until the next change completes the split.
    split_pending: tuple[dict[int, _Storage], dict[str, set[int]], Any] | None = None
    allocator: CachingAllocator | None = None
    #: The books' history (:mod:`simulators.devices.memory.history`), where a dry run asked for it.
    timeline: Timeline | None = None
    history: AllocationHistory | None = None

    @property
    def reserved(self) -> int:
        """Bytes the device reserves now: its allocator model's segments (without a model, what it holds)."""
        return self.allocator.reserved if self.allocator else self.allocated


class DeviceMemory:
    """The books of one mock device family's devices in this process (indexed by device)."""

    def __init__(self, device_type: str, caching: bool | None = None) -> None:
        self.device_type = device_type
        self.caching = device_type in CACHING_FAMILIES if caching is None else caching
        self._devices: dict[int, _Device] = {}
        # Re-entrant: a weakref callback may run (garbage collection) while the lock is held.
        self._lock = threading.RLock()
        # A release that garbage collection runs while an allocator model is mid-call waits for the call to end.
        self._busy = False
        self._pending: list[tuple[CachingAllocator, Block]] = []
        self._watchers: set[weakref.ref] = set()
        #: :mod:`simulators.devices.memory.peaks` once a dry run asked for memory reports (None: no records kept).
        self.recorder = None
        #: Whether each device keeps a timeline, and the frames function of an allocation history (None: none kept).
        self.timelines = False
        self.history_frames = None

    def keep_history(self, timelines: bool, frames=None) -> None:
        """Keep each device's timeline (and, given ``frames``, the function that gives an allocation's frames, its
        allocation history on a device with the caching-allocator model) from now on."""
        with self._lock:
            self.timelines, self.history_frames = timelines, frames
            for device in self._devices.values():
                self._start_history(device)

    def _start_history(self, device: _Device) -> None:
        if self.timelines and device.timeline is None:
            device.timeline = Timeline()
        if self.history_frames is not None and device.allocator is not None and device.history is None:
            device.history = AllocationHistory(self.history_frames)
            device.allocator.history = device.history.entries

    def track(self, payload: torch.Tensor, index: int) -> None:
        """Count ``payload``'s storage on device ``index`` while it lives; OutOfMemoryError past the budget.

        ``payload`` is the CPU (or meta) tensor a device tensor wraps (and the only one to hold it).
        """
        if payload.layout is not torch.strided or payload.device.type not in _PAYLOAD_DEVICES:
            return
        key, size = storage_key(payload), payload.untyped_storage().nbytes()
        with self._lock:
            device = self._device(index)
            known = device.storages.get(key)
            if known is None:
                block = self._malloc(device, index, size)
                frames = device.history.alloc(block.addr, size) if device.history is not None and block is not None else None
                self._grow(device, index, size)
                known = device.storages[key] = _Storage(size, block=block, frames=frames)
            known.holders += 1
            # The payload, not the tensor: torch swaps a module's parameters only when they have no weakref.
            self._watchers.add(weakref.ref(payload, self._releaser(index, key)))

    def resized(self, payload: torch.Tensor, index: int) -> None:
        """Count the new size of ``payload``'s storage after an op wrote into it (``out=``, ``resize_``)."""
        if payload.layout is not torch.strided or payload.device.type not in _PAYLOAD_DEVICES:
            return
        storage = payload.untyped_storage()
        with self._lock:
            device = self._devices.get(index)
            known = device.storages.get(storage_key(payload)) if device else None
            if known is None or known.size == storage.nbytes():
                return
            self._resize(device, index, known, storage.nbytes())

    def storage_resizing(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Count ``storage`` (a mock tensor's payload storage, when the books know it) at ``nbytes`` before torch
        resizes it: FSDP2 frees its unsharded parameters with ``untyped_storage().resize_(0)`` and allocates
        them again so. OutOfMemoryError past the budget (nothing is resized then)."""
        key = storage._cdata
        with self._lock:
            for index, device in self._devices.items():
                known = device.storages.get(key)
                if known is not None:
                    self._resize(device, index, known, nbytes)
                    return

    def _device(self, index: int) -> _Device:
        device = self._devices.get(index)
        if device is None:
            allocator = CachingAllocator(Settings.from_env()) if self.caching else None
            device = self._devices[index] = _Device(allocator=allocator)
            self._start_history(device)
        return device

    def _resize(self, device: _Device, index: int, known: _Storage, nbytes: int) -> None:
        """Count ``known`` at ``nbytes``: the new block is taken before the old one is freed (``resize_bytes_cuda``)."""
        block = self._malloc(device, index, nbytes)
        history = device.history
        frames = history.alloc(block.addr, nbytes) if history is not None and block is not None else None
        self._grow(device, index, nbytes - known.size)
        if known.block is not None:
            if history is not None:
                history.free(known.block.addr, known.size, known.frames)
            self._free(device.allocator, known.block)
        known.size, known.block, known.frames = nbytes, block, frames

    def _malloc(self, device: _Device, index: int, nbytes: int) -> Block | None:
        """The allocator model's block for ``nbytes`` (None without a model or for 0 bytes, which torch does not
        allocate); OutOfMemoryError when the model cannot reserve a segment for it within the budget."""
        if device.allocator is None or nbytes == 0:
            return None
        device.allocator.capacity = machine.device_capacity()
        self._busy = True
        try:
            return device.allocator.malloc(nbytes)
        except AllocatorOutOfMemory as error:
            refused = error.size
        finally:
            self._settle()
        self._out_of_memory(device, index, refused)
        return None  # not reached: _out_of_memory raises

    def _free(self, allocator: CachingAllocator, block: Block) -> None:
        if self._busy:
            self._pending.append((allocator, block))
            return
        self._busy = True
        try:
            allocator.free(block)
        finally:
            self._settle()

    def _settle(self) -> None:
        """Make the releases that came during an allocator call, then let the next call in."""
        try:
            while self._pending:
                allocator, block = self._pending.pop()
                allocator.free(block)
        finally:
            self._busy = False

    def _grow(self, device: _Device, index: int, size: int) -> None:
        """Add ``size`` bytes (which may be negative) to ``device``; OutOfMemoryError past its budget (without an
        allocator model: with one, the model has reserved the memory already)."""
        if size > 0 and device.allocator is None:
            self._check_budget(device, index, size)
        if device.split_pending is not None and self.recorder is not None:
            self.recorder.on_change(self, index, device)
        device.allocated += size
        timeline = device.timeline
        if timeline is not None:
            timeline.add(device.allocated, device.reserved)
        if device.allocated > device.peak:
            device.peak = device.allocated
            if timeline is not None:
                timeline.peaked(device.allocated, device.reserved)
            if self.recorder is not None:
                self.recorder.on_peak(self, index, device)

    def entry(self, payload: torch.Tensor, index: int) -> _Storage | None:
        """The books' entry of ``payload``'s storage on device ``index`` (None when it holds no such storage)."""
        device = self._devices.get(index)
        return device.storages.get(storage_key(payload)) if device is not None else None

    def held(self) -> dict[int, dict[int, _Storage]]:
        """Per device: a copy of the storages it holds now, by key."""
        with self._lock:
            return {index: dict(device.storages) for index, device in self._devices.items()}

    def allocated(self, index: int) -> int:
        """Bytes device ``index`` holds now."""
        with self._lock:
            return self._devices.get(index, _Device()).allocated

    def peak(self, index: int) -> int:
        """The most bytes device ``index`` held since the start or the last :meth:`reset_peak`."""
        with self._lock:
            return self._devices.get(index, _Device()).peak

    def reserved(self, index: int) -> int:
        """Bytes device ``index`` reserves now: its allocator model's segments (without a model, what it holds)."""
        with self._lock:
            device = self._devices.get(index, _Device())
            return device.reserved

    def peak_reserved(self, index: int) -> int:
        """The most bytes device ``index`` reserved since the start or the last :meth:`reset_peak`."""
        with self._lock:
            device = self._devices.get(index, _Device())
            return device.allocator.max_reserved if device.allocator else device.peak

    def reset_peak(self, index: int) -> None:
        """Start device ``index``'s peaks (held and reserved) again from what it holds and reserves now."""
        with self._lock:
            device = self._device(index)
            device.peak, device.split_at = device.allocated, 0
            if device.allocator is not None:
                device.allocator.reset_peak()
            if device.timeline is not None:
                device.timeline.peaked(device.allocated, device.reserved)

    def empty_cache(self) -> None:
        """Release the fully free segments of every device's allocator model (``torch.cuda.empty_cache``)."""
        with self._lock:
            for device in self._devices.values():
                if device.allocator is not None:
                    self._busy = True
                    try:
                        device.allocator.empty_cache()
                    finally:
                        self._settle()
                    if device.timeline is not None:
                        device.timeline.add(device.allocated, device.allocator.reserved)

    def summaries(self) -> dict[int, dict]:
        """Per device: its peak, the step and line where it was reached, what it held then, what it holds now, and
        its peak of reserved memory."""
        with self._lock:
            summaries = {}
            for index, device in sorted(self._devices.items()):
                parts = dict(device.split or {})
                parts["other"] = device.peak - sum(parts.values())
                reserved = device.allocator.max_reserved if device.allocator else device.peak
                summaries[index] = {"peak": device.peak, "reserved": reserved, "step": device.peak_step,
                                    "at": device.peak_at, "parts": parts, "allocated": device.allocated}
            return summaries

    def timelines_report(self) -> dict[int, dict]:
        """Per device that keeps one: its timeline (:meth:`simulators.devices.memory.history.Timeline.report`)."""
        with self._lock:
            return {index: device.timeline.report() for index, device in sorted(self._devices.items()) if device.timeline}

    def mark_step(self, step: int) -> None:
        """Optimizer step ``step`` begins now on every device's timeline."""
        with self._lock:
            for device in self._devices.values():
                if device.timeline is not None:
                    device.timeline.step(step)

    def snapshot(self) -> dict:
        """This family's devices as ``torch.cuda.memory._snapshot()`` reports them (:func:`simulators.devices.memory.history.snapshot`)."""
        with self._lock:
            return snapshot({index: (device.allocator, device.history,
                                     {storage.block.addr: (storage.block, storage.size, storage.frames or [])
                                      for storage in device.storages.values() if storage.block is not None})
                             for index, device in self._devices.items()})

    def info(self, index: int) -> tuple[int, int]:
        """``(free, total)`` bytes of device ``index``, as ``torch.cuda.mem_get_info`` reports them: the budget less
        what the GPU's runtime holds beside the allocator and what the device reserves."""
        total = machine.device_memory() or machine.UNBUDGETED_TOTAL
        return max(total - machine.device_held() - self.reserved(index), 0), total

    def _check_budget(self, device: _Device, index: int, size: int) -> None:
        budget = machine.device_capacity()
        if budget is None or device.allocated + size <= budget:
            return
        self._out_of_memory(device, index, size)

    def _out_of_memory(self, device: _Device, index: int, size: int) -> None:
        """Raise torch's OutOfMemoryError for ``size`` bytes asked of device ``index`` (recorded first)."""
        budget, capacity = machine.device_memory() or 0, machine.device_capacity() or 0
        used, reserved = device.allocated, ""
        if device.allocator is not None:
            used = device.allocator.reserved
            reserved = f"{machine.human(device.allocator.reserved)} reserved in total by PyTorch; "
        message = (
            f"{self.device_type.upper()} out of memory. Tried to allocate {machine.human(size)} ({self.device_type}:{index}; "
            f"{machine.human(budget)} total capacity; {machine.human(device.allocated)} already allocated; {reserved}"
            f"{machine.human(max(capacity - used, 0))} free; simulators mock device budget "
            f"{machine.MEMORY_VARIABLE}={os.environ.get(machine.MEMORY_VARIABLE)})"
        )
        if device.history is not None:
            device.history.out_of_memory(size, max(capacity - used, 0))
        if self.recorder is not None:
            self.recorder.on_out_of_memory(self, index, message)
        raise torch.OutOfMemoryError(message)

    def _releaser(self, index: int, key: int):
        def release(watcher: weakref.ref) -> None:
            with self._lock:
                self._watchers.discard(watcher)
                device = self._devices[index]
                storage = device.storages[key]
                storage.holders -= 1
                if storage.holders == 0:
                    del device.storages[key]
                    device.allocated -= storage.size
                    if storage.block is not None:
                        if device.history is not None:
                            device.history.free(storage.block.addr, storage.size, storage.frames)
                        self._free(device.allocator, storage.block)
                    if device.timeline is not None:
                        device.timeline.add(device.allocated, device.reserved)

        return release
