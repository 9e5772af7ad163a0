"""The simulated machine's accelerators: how many each rank sees and how much memory each has.

The environment contract (read every time it is queried, not only at
import, so a conformance case's ``env=`` can change it between cases in the
persistent rank pool):

- ``SIMULATORS_NPU_DEVICE_COUNT`` / ``SIMULATORS_XLA_DEVICE_COUNT`` /
  ``SIMULATORS_CUDA_DEVICE_COUNT``: the
  number of mock devices of the family every rank sees (``npu:0`` ..
  ``npu:<N-1>``). Unset: one per rank of the simulated machine
  (``LOCAL_WORLD_SIZE``), as before;
- ``SIMULATORS_DEVICE_MEMORY``: each device's memory budget, as bytes
  (``"67108864"``) or a size string (``"64MB"`` = 64 * 10**6, ``"64MiB"`` =
  64 * 2**20, as 🤗 Accelerate's ``max_memory`` strings read). Unset or
  empty: no budget (``mem_get_info`` reports :data:`UNBUDGETED_TOTAL`).

Each rank is a machine of its own: its devices and their memory are its
process's (a rank's allocations never count against another rank's budget).

Catalog: the "Big-model inference" rows (``modeling.device_map``,
``bigmodel.dispatch_model``, ...: device maps over several accelerators),
``npu.distributed_type``.
"""
from __future__ import annotations

import functools
import os
import re

from simulators.devices.families.gpus import DEFAULT_GPU, GPU_PRESETS, GpuPreset, preset, runtime_held

#: The device-count variable of each mock device family.
COUNT_VARIABLES = {
    "npu": "SIMULATORS_NPU_DEVICE_COUNT", "xla": "SIMULATORS_XLA_DEVICE_COUNT", "cuda": "SIMULATORS_CUDA_DEVICE_COUNT",
}
#: The per-device memory budget variable (all families).
MEMORY_VARIABLE = "SIMULATORS_DEVICE_MEMORY"
#: Set (to 1; "" or "0": off) in a rank: mock-device tensors carry no values (``--no-compute``, :mod:`simulators.devices.no_compute.meta_payloads`).
NO_COMPUTE_ENV = "SIMULATORS_NO_COMPUTE"
#: Set (to N) in a rank: it ends, exit 0, once an optimizer has made N steps (``--steps``).
STEPS_ENV = "SIMULATORS_STEPS"
#: What ``mem_get_info`` reports as the total of a device without a budget: 64 GiB.
UNBUDGETED_TOTAL = 64 << 30

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


@functools.lru_cache(maxsize=64)
def parse_size(text: str) -> int:
    """Bytes in ``text``: ``"1048576"``, ``"64MB"`` (10**6), ``"500MiB"`` (2**20), ``"1.5GB"``.

    Raises ValueError naming the value when it does not parse.
    """
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a memory size: give bytes or a number with one of "
            "KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB (powers of 2)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r} is not a memory size: it must be more than 0 bytes")
    return size


def device_memory() -> int | None:
    """Each device's budget in bytes (``SIMULATORS_DEVICE_MEMORY``), or None when there is none."""
    text = os.environ.get(MEMORY_VARIABLE, "").strip()
    if not text:
        return None
    try:
        return parse_size(text)
    except ValueError as error:
        raise ValueError(f"{MEMORY_VARIABLE}: {error}") from None


def device_count(kind: str, default: int) -> int:
    """The number of ``kind`` devices a rank sees: ``SIMULATORS_<KIND>_DEVICE_COUNT``, else ``default``."""
    variable = COUNT_VARIABLES[kind]
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    return parse_count(text, variable)


def parse_count(text: str, name: str) -> int:
    """``text`` as a device count (a positive integer); ValueError naming ``name`` otherwise."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{name}: {text!r} is not a device count (a positive integer)")
    return count


def machine_env(kind: str, count: int | None = None, memory: str | None = None) -> dict[str, str]:
    """The environment giving every rank ``count`` ``kind`` devices of ``memory`` each (None: leave as is).

    Raises ValueError naming the value that is not a count or a size.
    """
    env: dict[str, str] = {}
    if count is not None:
        env[COUNT_VARIABLES[kind]] = str(parse_count(str(count), "--device-count"))
    if memory is not None:
        try:
            parse_size(memory)
        except ValueError as error:
            raise ValueError(f"--device-memory: {error}") from None
        env[MEMORY_VARIABLE] = memory
    return env


#: Bytes each simulated GPU's runtime holds beside torch's allocator (CUDA context, NCCL), set from ``--gpu``.
HELD_VARIABLE = "SIMULATORS_DEVICE_HELD"
#: The simulated GPU's compute capability (``"8.0"``), set from ``--gpu``; unset: :data:`DEFAULT_GPU`'s.
CAPABILITY_VARIABLE = "SIMULATORS_GPU_CAPABILITY"
#: The simulated GPU's streaming multiprocessors, set from ``--gpu``; unset: :data:`DEFAULT_GPU`'s.
MULTIPROCESSORS_VARIABLE = "SIMULATORS_GPU_MULTIPROCESSORS"
#: Resident threads per multiprocessor by compute capability (CUDA C Programming Guide, "Compute Capabilities"):
#: 2048 on 7.0, 8.0, 9.0 and 10.0, 1024 on 7.5, 1536 on 8.6, 8.9 and 12.0.
THREADS_PER_MULTIPROCESSOR = {(7, 5): 1024, (8, 6): 1536, (8, 7): 1024, (8, 9): 1536, (12, 0): 1536}


def gpu_budget(name: str) -> str:
    """The memory of GPU preset ``name`` as torch reports it, in bytes; ValueError naming the presets for an unknown one."""
    return str(preset(name).memory)


def gpu_env(name: str, world_size: int = 1) -> dict[str, str]:
    """The environment simulating GPU preset ``name``'s architecture and, in each of ``world_size`` ranks, what the
    GPU's runtime holds beside torch's allocator (:func:`simulators.devices.families.gpus.runtime_held`; ValueError for an
    unknown preset)."""
    card = preset(name)
    major, minor = card.capability
    return {CAPABILITY_VARIABLE: f"{major}.{minor}", MULTIPROCESSORS_VARIABLE: str(card.multiprocessors),
            HELD_VARIABLE: str(sum(runtime_held(world_size).values()))}


def device_held() -> int:
    """Bytes each device's runtime holds beside torch's allocator (``SIMULATORS_DEVICE_HELD``; 0 when unset)."""
    value = os.environ.get(HELD_VARIABLE, "").strip()
    return int(value) if value.isdigit() else 0


def device_capacity() -> int | None:
    """What torch's allocator may reserve on each device: the budget less what the runtime holds (None: no budget)."""
    budget = device_memory()
    return None if budget is None else max(budget - device_held(), 0)


def gpu_capability() -> tuple[int, int]:
    """The simulated GPU's compute capability: ``SIMULATORS_GPU_CAPABILITY`` (``"9.0"``), else :data:`DEFAULT_GPU`'s."""
    value = os.environ.get(CAPABILITY_VARIABLE, "")
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", value)
    return (int(match.group(1)), int(match.group(2))) if match else GPU_PRESETS[DEFAULT_GPU].capability


def gpu_multiprocessors() -> int:
    """The simulated GPU's streaming multiprocessors: ``SIMULATORS_GPU_MULTIPROCESSORS``, else :data:`DEFAULT_GPU`'s."""
    value = os.environ.get(MULTIPROCESSORS_VARIABLE, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else GPU_PRESETS[DEFAULT_GPU].multiprocessors


def gpu_threads_per_multiprocessor() -> int:
    """The simulated GPU's resident threads per multiprocessor (:data:`THREADS_PER_MULTIPROCESSOR`)."""
    return THREADS_PER_MULTIPROCESSOR.get(gpu_capability(), 2048)


def human(size: int) -> str:
    """``size`` bytes as CUDA's out-of-memory messages write them (``"20.00 MiB"``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{size} bytes"


__all__ = [
    "COUNT_VARIABLES", "MEMORY_VARIABLE", "UNBUDGETED_TOTAL",
    "parse_size", "device_memory", "device_count", "parse_count", "machine_env", "human", "GPU_PRESETS", "gpu_budget",
    "DEFAULT_GPU", "CAPABILITY_VARIABLE", "HELD_VARIABLE", "device_held", "device_capacity", "MULTIPROCESSORS_VARIABLE",
    "THREADS_PER_MULTIPROCESSOR", "GpuPreset",
    "gpu_env", "gpu_capability", "gpu_multiprocessors", "gpu_threads_per_multiprocessor",
]
