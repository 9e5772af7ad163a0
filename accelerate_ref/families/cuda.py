"""NVIDIA GPUs joined by nccl."""

from __future__ import annotations

import torch

from ..utils.dataclasses import DistributedType
from .base import DeviceFamily, device_of_local_rank


class CudaFamily(DeviceFamily):
    """Available when torch sees a CUDA device; one GPU per local rank."""

    name = "cuda"
    backend = "nccl"
    distributed_type = DistributedType.MULTI_GPU

    def backend_for(self, requested: str | None) -> str:
        """Any backend asked for (gloo, ...), else nccl: HF 1.15 passes a requested backend on for GPUs."""
        return requested or self.backend

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        return device_of_local_rank("cuda", torch.cuda, local_rank, distributed)
