"""Ascend NPUs (through `torch_npu`) joined by hccl."""

from __future__ import annotations

import torch

from ..utils.dataclasses import DistributedType
from ..utils.imports import is_npu_available
from .base import DeviceFamily, device_of_local_rank


class NpuFamily(DeviceFamily):
    """Available when `torch_npu` is installed and torch sees an NPU; one NPU per local rank.

    A distributed launch is ``MULTI_NPU`` over ``hccl``. Preferred over CUDA,
    as in HF accelerate (its issue #3020: ``transfer_to_npu`` makes CUDA calls
    land on the NPU). Catalog: ``npu.distributed_type``, ``npu.collectives``.
    """

    name = "npu"
    backend = "hccl"
    distributed_type = DistributedType.MULTI_NPU

    def is_available(self) -> bool:
        return is_npu_available()

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        return device_of_local_rank("npu", torch.npu, local_rank, distributed)
