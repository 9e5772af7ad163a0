"""XLA devices (TPU, or torch-xla's PJRT runtime on CPU or GPU), one replica per rank."""

from __future__ import annotations

import importlib

import torch

from ..utils.dataclasses import DistributedType
from ..utils.imports import is_torch_xla_available
from .base import DeviceFamily, LaunchEnv


class XlaFamily(DeviceFamily):
    """Available when `torch_xla` is installed (and not disabled with ``USE_TORCH_XLA=0``); preferred over all.

    Rules (torch-xla 2.9's API; catalog ``xla.distributed_type``, ``xla.collectives``):

    * a distributed launch is ``DistributedType.XLA``; each rank is one XLA
      replica, computing on ``torch_xla.device()`` (``xla:<local ordinal>``);
    * topology comes from ``torch_xla.runtime`` (``world_size``,
      ``global_ordinal``, ``local_ordinal``);
    * ``wait_for_everyone`` is ``xm.rendezvous`` (catalog ``sync.wait_for_everyone``);
    * collectives go through ``xm`` (`accelerate_ref.utils._operations.collectives.XlaCollectives`);
    * the torch.distributed group that DDP trains with is torch-xla's ``xla``
      backend, joined through ``init_method="xla://"``;
    * moving a module to XLA makes new tensors, so ``Module.to`` would replace
      its parameters (HF accelerate re-points optimizers afterwards); here
      they are swapped in place (``torch.utils.swap_tensors``), keeping their
      identity (catalog ``prepare.order``).
    """

    name = "xla"
    backend = "xla"
    distributed_type = DistributedType.XLA
    init_method = "xla://"

    def is_available(self) -> bool:
        return is_torch_xla_available()

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        return importlib.import_module("torch_xla").device()

    def init_process_group(self, launch: LaunchEnv, backend: str | None, **kwargs) -> None:
        importlib.import_module("torch_xla.distributed.xla_backend")  # registers the "xla" backend and xla://
        super().init_process_group(launch, backend, **kwargs)

    def world(self, launch: LaunchEnv) -> tuple[int, int, int]:
        runtime = importlib.import_module("torch_xla.runtime")
        return runtime.world_size(), runtime.global_ordinal(), runtime.local_ordinal()

    def move_module(self, module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        swapping = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return module.to(device)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(swapping)

    def barrier(self) -> None:
        importlib.import_module("torch_xla.core.xla_model").rendezvous("accelerate_ref.wait_for_everyone")
