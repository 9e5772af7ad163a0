"""NVIDIA GPUs joined by nccl."""

from __future__ import annotations

import torch

from ..utils.dataclasses import DistributedType
from .base import DeviceFamily


class CudaFamily(DeviceFamily):
    """Available when torch sees a CUDA device; one GPU per local rank."""

    name = "cuda"
    backend = "nccl"
    distributed_type = DistributedType.MULTI_GPU

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        index = local_rank % torch.cuda.device_count() if distributed else torch.cuda.current_device()
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        return device
