"""Device families: one module per kind of hardware, chosen in one place.

`PartialState` asks :func:`detect` which family the current launch runs on and
then talks only to the returned :class:`DeviceFamily`. Adding a family (XLA,
NPU, ...) means adding a module here and an entry in :data:`FAMILIES`; no
caller changes.
"""

from __future__ import annotations

from .base import DeviceFamily, LaunchEnv
from .cpu import CpuFamily
from .cuda import CudaFamily
from .npu import NpuFamily
from .xla import XlaFamily

#: Families in order of preference: the first available one wins, CPU last.
#: XLA first and NPU before CUDA, as HF accelerate prefers them.
FAMILIES: list[DeviceFamily] = [XlaFamily(), NpuFamily(), CudaFamily(), CpuFamily()]


def detect(cpu: bool = False) -> DeviceFamily:
    """Return the family the process should run on.

    ``cpu=True`` forces the CPU family even where an accelerator exists
    (catalog ``cpu.flag``).
    """
    if cpu:
        return next(family for family in FAMILIES if family.name == "cpu")
    return next(family for family in FAMILIES if family.is_available())


__all__ = ["FAMILIES", "DeviceFamily", "LaunchEnv", "detect"]
