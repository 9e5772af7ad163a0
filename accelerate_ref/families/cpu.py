"""CPU ranks joined by gloo: the default everywhere."""

from __future__ import annotations

import torch

from ..utils.dataclasses import DistributedType
from .base import DeviceFamily


class CpuFamily(DeviceFamily):
    """Always available. A torchrun-style launch on CPU is ``MULTI_CPU`` over gloo.

    Unlike HF accelerate 1.15 (which silently runs one process per rank
    unless ``cpu=True`` or ``ACCELERATE_USE_CPU`` is set), the reference needs
    no extra flag: the launch environment alone decides.
    """

    name = "cpu"
    backend = "gloo"
    distributed_type = DistributedType.MULTI_CPU

    def is_available(self) -> bool:
        return True

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        return torch.device("cpu")
