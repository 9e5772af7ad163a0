"""``torch.npu``: device selection, RNG and memory queries of the mock NPUs.

Rules: ``is_available()`` is true; ``device_count()`` is
``SIMULATORS_NPU_DEVICE_COUNT``, else the number of ranks on this simulated
machine; ``set_device`` / ``current_device`` select this process's NPU (0
until set); the RNG functions act on each device's own generator; the
memory queries report each device's books (:mod:`simulators.devices.memory`:
the live tensors' storages against the ``SIMULATORS_DEVICE_MEMORY`` budget);
``device`` arguments default to the current NPU.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import torch

from simulators.devices import npu as _mock

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return _mock.device_count()


def set_device(device: int | str | torch.device) -> None:
    """Make ``device`` (an index, ``"npu:1"`` or a ``torch.device``) this process's NPU."""
    _mock.set_current(_index(device))


def current_device() -> int:
    return _mock.current()


class device:
    """``with torch.npu.device(i):`` makes ``i`` the current NPU inside the block."""

    def __init__(self, device: int | str | torch.device) -> None:
        self.index = _index(device, current_device())
        self.previous = current_device()

    def __enter__(self) -> None:
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc_info: Any) -> None:
        set_device(self.previous)


def synchronize(device: Any = None) -> None:
    """Wait for the device's work (the mock's ops finish at once)."""


def empty_cache() -> None:
    """Release cached device memory (the mock caches none)."""


def memory_allocated(device: Any = None) -> int:
    """Bytes the live tensors on the NPU hold."""
    return _mock.NpuTensor.memory.allocated(_index(device, current_device()))


def max_memory_allocated(device: Any = None) -> int:
    """The most bytes the NPU held since the start or the last ``reset_peak_memory_stats``."""
    return _mock.NpuTensor.memory.peak(_index(device, current_device()))


def memory_reserved(device: Any = None) -> int:
    """Bytes reserved on the NPU: what is allocated (the mock caches nothing)."""
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Start the NPU's peak again from what it holds now."""
    _mock.NpuTensor.memory.reset_peak(_index(device, current_device()))


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the NPU: its budget (64 GiB without one) less what it holds."""
    return _mock.NpuTensor.memory.info(_index(device, current_device()))


def is_bf16_supported() -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def manual_seed(seed: int) -> None:
    """Seed the current NPU's generator."""
    _mock.generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every NPU's generator (``torch.manual_seed`` calls this)."""
    for index in range(device_count()):
        _mock.generator(index).manual_seed(int(seed))


def seed() -> None:
    _mock.generator(current_device()).seed()


def seed_all() -> None:
    for index in range(device_count()):
        _mock.generator(index).seed()


def initial_seed() -> int:
    return _mock.generator(current_device()).initial_seed()


def get_rng_state(device: Any = "npu") -> torch.Tensor:
    return _mock.generator(_index(device, current_device())).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
    _mock.generator(_index(device, current_device())).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [_mock.generator(index).get_state() for index in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        _mock.generator(index).set_state(state)


def _index(device: int | str | torch.device | None, default: int = 0) -> int:
    if device is None:
        return default
    if isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = default if index is None else index
    _mock.NpuTensor.check_index(index)
    return index


#: ``torch.npu.amp``: the NPU's autocast context and gradient scaler.
amp = SimpleNamespace(
    autocast=functools.partial(torch.autocast, "npu"),
    GradScaler=functools.partial(torch.amp.GradScaler, "npu"),
)
