"""The ``torch.<device>`` module API of a mock device family: selection, RNG, memory, streams.

A :class:`DeviceRuntime` serves one family (its tensor class, which knows the
device count and memory books) and keeps the family's process state: the
current device and one generator per device. Rules, those of ``torch.cuda``
and ``torch.npu``:

- ``is_available()`` is true; ``device_count()`` is the family's count
  (:mod:`simulators.devices.families.machine`); ``set_device`` / ``current_device``
  select this process's device (0 until set; an index past the count is
  refused as an invalid device ordinal); ``device`` arguments (an index,
  ``"cuda:1"``, a ``torch.device``) default to the current device;
- the RNG functions act on each device's own generator (made on first use
  with torch's default seed); ``manual_seed_all`` seeds every device, and
  ``torch.manual_seed`` calls it;
- the memory queries report each device's books (the live tensors' storages
  against the ``SIMULATORS_DEVICE_MEMORY`` budget); reserved memory is what
  the device's model of torch's caching allocator holds in segments (on
  ``cuda``; see :mod:`simulators.devices.memory.books`; elsewhere it equals
  allocated), ``empty_cache`` releases the fully free ones, and
  ``reset_peak_memory_stats`` restarts both peaks;
- the mock's ops finish at once: ``synchronize``, streams and events wait for
  nothing (a `Stream` is a context manager, an `Event` records nothing and
  reports 0 ms between two records).

Catalog: ``npu.distributed_type`` and the dry runs of "Launching"
(``accelerate-ref launch --simulate``).
"""
from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from simulators.devices.families import machine
from simulators.devices.families.replicas import replicas
from simulators.devices.families.tensor import DeviceTensor

DeviceArg = int | str | torch.device | None


class RuntimeTensor(DeviceTensor):
    """A tensor of a family served by a :class:`DeviceRuntime` (``cuda``, ``npu``): its current device
    and generators are the runtime's; a rank sees ``SIMULATORS_<FAMILY>_DEVICE_COUNT`` devices, else one
    per rank of its simulated machine."""

    #: Set by the family's :class:`DeviceRuntime`.
    runtime: "DeviceRuntime"

    @classmethod
    def device_count(cls) -> int:
        return machine.device_count(cls.device_type, replicas().local_world_size)

    @classmethod
    def current_index(cls) -> int:
        return cls.runtime.current

    @classmethod
    def generator_for(cls, index: int) -> torch.Generator:
        return cls.runtime.generator(index)

    def __tensor_flatten__(self) -> tuple[list[str], int]:
        return ["_payload"], self.device_index

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, torch.Tensor], index: int, size: object, stride: object) -> "RuntimeTensor":
        return cls.wrap(inner["_payload"], index)


class DeviceRuntime:
    """One family's ``torch.<device>`` API (see the module docstring); its methods are the module's functions."""

    def __init__(self, tensor_class: type[RuntimeTensor]) -> None:
        self.tensor_class = tensor_class
        tensor_class.runtime = self
        self.current = 0
        self.generators: dict[int, torch.Generator] = {}

    # -- selection ---------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def _lazy_init(self) -> None:
        """What torch's C++ side calls before it first touches the device: the mock is ready."""

    def init(self) -> None:
        """Initialise the device runtime (the mock is ready)."""

    def device_count(self) -> int:
        return self.tensor_class.device_count()

    def current_device(self) -> int:
        return self.current

    def set_device(self, device: DeviceArg) -> None:
        """Make ``device`` this process's current device."""
        self.current = self.index(device)

    @contextlib.contextmanager
    def device(self, device: DeviceArg) -> Iterator[None]:
        """``with torch.<device>.device(i):`` makes ``i`` the current device inside the block."""
        previous = self.current
        self.set_device(device)
        try:
            yield
        finally:
            self.current = previous

    def index(self, device: DeviceArg) -> int:
        """The device index ``device`` means (None and an index-less device: the current one), checked."""
        if device is None:
            index = self.current
        elif isinstance(device, int):
            index = device
        else:
            index = torch.device(device).index
            index = self.current if index is None else index
        self.tensor_class.check_index(index)
        return index

    def get_device_name(self, device: DeviceArg = None) -> str:
        self.index(device)
        return f"simulated {self.tensor_class.device_type.upper()} device"

    def get_device_capability(self, device: DeviceArg = None) -> tuple[int, int]:
        """The simulated GPU's (:func:`simulators.devices.families.machine.gpu_capability`; an H100's 9.0 by default)."""
        self.index(device)
        return machine.gpu_capability()

    def get_device_properties(self, device: DeviceArg = None) -> SimpleNamespace:
        """The device's name, capability, memory (its budget) and multiprocessors (the simulated GPU's for the
        CUDA family, :func:`simulators.devices.families.machine.gpu_multiprocessors`; 1 for the others)."""
        index = self.index(device)
        major, minor = self.get_device_capability(index)
        processors = machine.gpu_multiprocessors() if self.tensor_class.device_type == "cuda" else 1
        return SimpleNamespace(
            name=self.get_device_name(index), major=major, minor=minor,
            total_memory=self.tensor_class.memory.info(index)[1], multi_processor_count=processors,
        )

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return True

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    # -- work and streams --------------------------------------------------
    def synchronize(self, device: DeviceArg = None) -> None:
        """Wait for the device's work (the mock's ops finish at once)."""
        self.index(device)

    def current_stream(self, device: DeviceArg = None) -> Stream:
        return Stream(self.index(device))

    def default_stream(self, device: DeviceArg = None) -> Stream:
        return Stream(self.index(device))

    def stream(self, stream: Stream | None) -> contextlib.AbstractContextManager:
        """``with torch.<device>.stream(s):`` (work on the mock runs in order whatever the stream)."""
        return contextlib.nullcontext(stream)

    # -- memory -------------------------------------------------------------
    def empty_cache(self) -> None:
        """Release the cached segments no tensor uses (every device's allocator model)."""
        self.tensor_class.memory.empty_cache()

    def ipc_collect(self) -> None:
        """Release memory other processes no longer share (the mock shares none)."""

    def memory_allocated(self, device: DeviceArg = None) -> int:
        """Bytes the live tensors on the device hold."""
        return self.tensor_class.memory.allocated(self.index(device))

    def max_memory_allocated(self, device: DeviceArg = None) -> int:
        """The most bytes the device held since the start or the last ``reset_peak_memory_stats``."""
        return self.tensor_class.memory.peak(self.index(device))

    def memory_reserved(self, device: DeviceArg = None) -> int:
        """Bytes the device's caching allocator model holds in segments (allocated or cached)."""
        return self.tensor_class.memory.reserved(self.index(device))

    def max_memory_reserved(self, device: DeviceArg = None) -> int:
        """The most bytes the device reserved since the start or the last ``reset_peak_memory_stats``."""
        return self.tensor_class.memory.peak_reserved(self.index(device))

    def reset_peak_memory_stats(self, device: DeviceArg = None) -> None:
        """Start the device's peaks (allocated and reserved) again from what it holds and reserves now."""
        self.tensor_class.memory.reset_peak(self.index(device))

    def reset_max_memory_allocated(self, device: DeviceArg = None) -> None:
        self.reset_peak_memory_stats(device)

    def mem_get_info(self, device: DeviceArg = None) -> tuple[int, int]:
        """``(free, total)`` bytes of the device: its budget (64 GiB without one) less what it reserves."""
        return self.tensor_class.memory.info(self.index(device))

    # -- random numbers -----------------------------------------------------
    def generator(self, index: int) -> torch.Generator:
        """The generator of device ``index``, made on first use with torch's default seed."""
        if index not in self.generators:
            self.generators[index] = torch.Generator()
        return self.generators[index]

    def manual_seed(self, seed: int) -> None:
        """Seed the current device's generator."""
        self.generator(self.current).manual_seed(int(seed))

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device's generator (``torch.manual_seed`` calls this)."""
        for index in range(self.device_count()):
            self.generator(index).manual_seed(int(seed))

    def seed(self) -> None:
        self.generator(self.current).seed()

    def seed_all(self) -> None:
        for index in range(self.device_count()):
            self.generator(index).seed()

    def initial_seed(self) -> int:
        return self.generator(self.current).initial_seed()

    def get_rng_state(self, device: DeviceArg = None) -> torch.Tensor:
        return self.generator(self.index(device)).get_state()

    def set_rng_state(self, new_state: torch.Tensor, device: DeviceArg = None) -> None:
        self.generator(self.index(device)).set_state(new_state)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.generator(index).get_state() for index in range(self.device_count())]

    def set_rng_state_all(self, new_states: list[torch.Tensor]) -> None:
        for index, state in enumerate(new_states):
            self.generator(index).set_state(state)

    #: The names a family's ``torch.<device>`` module takes from the runtime.
    API = (
        "is_available", "is_initialized", "_is_in_bad_fork", "_lazy_init", "init", "device_count",
        "current_device", "set_device", "device", "get_device_name", "get_device_capability", "get_device_properties",
        "is_bf16_supported",
        "get_amp_supported_dtype", "synchronize", "current_stream", "default_stream", "stream", "empty_cache",
        "ipc_collect", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "reset_peak_memory_stats", "reset_max_memory_allocated", "mem_get_info", "manual_seed", "manual_seed_all",
        "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state", "get_rng_state_all",
        "set_rng_state_all",
    )

    def api(self) -> dict[str, Any]:
        """The module functions (bound methods) by name, with the `Stream` and `Event` classes."""
        return {name: getattr(self, name) for name in self.API} | {"Stream": Stream, "Event": Event}


class Stream:
    """A stream of the mock device: work on it is done as soon as it is issued."""

    def __init__(self, device: DeviceArg = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = device
        self.priority = priority

    def synchronize(self) -> None:
        """Wait for the stream's work (done already)."""

    def wait_stream(self, stream: Stream) -> None:
        """Order this stream after ``stream`` (the mock's streams are always in order)."""

    def wait_event(self, event: Event) -> None:
        """Order this stream after ``event`` (recorded work is done already)."""

    def record_event(self, event: Event | None = None) -> Event:
        return event if event is not None else Event()

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        """Whether a CUDA graph is being captured on the stream (the mock captures none)."""
        return False

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None


class Event:
    """An event of the mock device: every record is complete at once, so timings between records are 0 ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Stream | None = None) -> None:
        """Mark the point in ``stream`` (reached already)."""

    def wait(self, stream: Stream | None = None) -> None:
        """Order ``stream`` after this event (reached already)."""

    def synchronize(self) -> None:
        """Wait for the event (reached already)."""

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Event) -> float:
        return 0.0
