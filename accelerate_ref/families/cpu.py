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

    def backend_for(self, requested: str | None) -> str:
        """mpi when asked for and torch has it, else gloo: HF 1.15's rule for CPU ranks, except that HF also
        picks mpi unasked where torch has it (the reference keeps gloo, the backend its simulated ranks use)."""
        if requested == "mpi" and torch.distributed.is_mpi_available():
            return "mpi"
        return self.backend

    def is_available(self) -> bool:
        return True

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        """``cpu`` for one process; ``cpu:0`` for a rank of several (HF 1.15 indexes the one CPU device)."""
        return torch.device("cpu", 0) if distributed else torch.device("cpu")
