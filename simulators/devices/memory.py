"""Memory of the mock devices: what each device holds, its peak, and out-of-memory past its budget.

Rules (the budget is :func:`simulators.devices.machine.device_memory`):

- a device holds the storages of the live tensors on it: a storage counts
  once, at its size in bytes, however many tensors (views, parameters, their
  ``.data``) share it, from when a tensor on the device first wraps it until
  the last of them dies (autograd's saved tensors keep theirs alive, as on
  hardware); an op that resizes it (``out=``, ``resize_``, the factories
  that fill an empty tensor) changes its size in the books, and so does a
  resize of the storage itself (``tensor.untyped_storage().resize_(0)``, how
  FSDP2 frees an unsharded parameter it still references);
- a new storage (or a resize) that would take a device past its budget raises torch's
  ``torch.OutOfMemoryError`` (what ``torch.cuda`` raises) naming the device,
  the size asked for, the budget, what is allocated and what is free; nothing
  is counted then;
- the peak is the most a device held since the process started or since
  :meth:`DeviceMemory.reset_peak`.

Each process keeps its own books: a rank is a machine of its own.

Catalog: the "Big-model inference" rows (``modeling.device_map``, ``bigmodel.dispatch_model``, ...).
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field

import torch

from simulators.devices import machine


#: Where payloads live: the CPU, or nowhere (meta) in no-compute mode; a meta storage counts at its size as well.
_PAYLOAD_DEVICES = ("cpu", "meta")


def storage_key(payload: torch.Tensor) -> int:
    """How the books name the storage of ``payload`` (a mock tensor's CPU payload): the storage itself, not
    its data pointer, which a resize changes."""
    return payload.untyped_storage()._cdata


@dataclass
class _Storage:
    """One storage on a device: its size and the live tensors that wrap it."""

    size: int
    holders: int = 0


@dataclass
class _Device:
    allocated: int = 0
    peak: int = 0
    storages: dict[int, _Storage] = field(default_factory=dict)
    #: When and where the peak was reached, and what it held (see :mod:`simulators.devices.peaks`).
    peak_step: int = 0
    peak_at: str = ""
    split: dict[str, int] | None = None
    split_at: int = 0


class DeviceMemory:
    """The books of one mock device family's devices in this process (indexed by device)."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self._devices: dict[int, _Device] = {}
        # Re-entrant: a weakref callback may run (garbage collection) while the lock is held.
        self._lock = threading.RLock()
        self._watchers: set[weakref.ref] = set()
        #: :mod:`simulators.devices.peaks` once a dry run asked for memory reports (None: no records kept).
        self.recorder = None

    def track(self, payload: torch.Tensor, index: int) -> None:
        """Count ``payload``'s storage on device ``index`` while it lives; OutOfMemoryError past the budget.

        ``payload`` is the CPU (or meta) tensor a device tensor wraps (and the only one to hold it).
        """
        if payload.layout is not torch.strided or payload.device.type not in _PAYLOAD_DEVICES:
            return
        key, size = storage_key(payload), payload.untyped_storage().nbytes()
        with self._lock:
            device = self._devices.setdefault(index, _Device())
            known = device.storages.get(key)
            if known is None:
                self._grow(device, index, size)
                known = device.storages[key] = _Storage(size)
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
            growth = storage.nbytes() - known.size
            self._grow(device, index, growth)
            known.size += growth

    def storage_resizing(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Count ``storage`` (a mock tensor's payload storage, when the books know it) at ``nbytes`` before torch
        resizes it: FSDP2 frees its unsharded parameters with ``untyped_storage().resize_(0)`` and allocates
        them again so. OutOfMemoryError past the budget (nothing is resized then)."""
        key = storage._cdata
        with self._lock:
            for index, device in self._devices.items():
                known = device.storages.get(key)
                if known is not None:
                    self._grow(device, index, nbytes - known.size)
                    known.size = nbytes
                    return

    def _grow(self, device: _Device, index: int, size: int) -> None:
        """Add ``size`` bytes (which may be negative) to ``device``; OutOfMemoryError past its budget."""
        if size > 0:
            self._check_budget(device, index, size)
        device.allocated += size
        if device.allocated > device.peak:
            device.peak = device.allocated
            if self.recorder is not None:
                self.recorder.on_peak(self, index, device)

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

    def reset_peak(self, index: int) -> None:
        """Start device ``index``'s peak again from what it holds now."""
        with self._lock:
            device = self._devices.setdefault(index, _Device())
            device.peak, device.split_at = device.allocated, 0

    def summaries(self) -> dict[int, dict]:
        """Per device: its peak, the step and line where it was reached, what it held then, what it holds now."""
        with self._lock:
            summaries = {}
            for index, device in sorted(self._devices.items()):
                parts = dict(device.split or {})
                parts["other"] = device.peak - sum(parts.values())
                summaries[index] = {"peak": device.peak, "step": device.peak_step, "at": device.peak_at,
                                    "parts": parts, "allocated": device.allocated}
            return summaries

    def info(self, index: int) -> tuple[int, int]:
        """``(free, total)`` bytes of device ``index``, as ``torch.cuda.mem_get_info`` reports them."""
        total = machine.device_memory() or machine.UNBUDGETED_TOTAL
        return max(total - self.allocated(index), 0), total

    def _check_budget(self, device: _Device, index: int, size: int) -> None:
        budget = machine.device_memory()
        if budget is None or device.allocated + size <= budget:
            return
        name = self.device_type.upper()
        message = (
            f"{name} out of memory. Tried to allocate {machine.human(size)} ({self.device_type}:{index}; "
            f"{machine.human(budget)} total capacity; {machine.human(device.allocated)} already allocated; "
            f"{machine.human(max(budget - device.allocated, 0))} free; simulators mock device budget "
            f"{machine.MEMORY_VARIABLE}={os.environ.get(machine.MEMORY_VARIABLE)})"
        )
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

        return release
