"""Local SGD: each process takes a few optimizer steps alone, then the model's parameters are averaged.

Mirrors `accelerate.local_sgd`. Rule: inside ``with LocalSGD(accelerator, model, K) as sgd``
the prepared model does not synchronise its gradients (its ``no_sync``); every K-th
``sgd.step()`` and the exit of the block replace every parameter by its mean over the
processes. With one process, or ``enabled=False``, it does nothing. An engine that shards
or partitions the model (DeepSpeed, Megatron-LM, FSDP, XLA) is refused with
NotImplementedError, as HF does.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

import torch

from .utils.dataclasses import DistributedType

if TYPE_CHECKING:
    from .accelerator import Accelerator

#: The distributed types whose processes each hold the whole model, where averaging the parameters is local SGD.
_REPLICATED_TYPES = {"NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_MLU", "MULTI_HPU", "MULTI_SDAA",
                     "MULTI_MUSA", "MULTI_NPU", "MULTI_NEURON"}


class LocalSGD:
    """Average ``model``'s parameters over the processes every ``local_sgd_steps`` steps (see the module)."""

    def __init__(self, accelerator: "Accelerator", model: torch.nn.Module, local_sgd_steps: int,
                 enabled: bool = True) -> None:
        distributed_type = accelerator.distributed_type
        if getattr(distributed_type, "name", str(distributed_type)) not in _REPLICATED_TYPES:
            raise NotImplementedError("LocalSGD is supported only for CPUs and GPUs (no DeepSpeed or MegatronLM)")
        self.enabled = enabled and distributed_type != DistributedType.NO
        self.num_steps = 0
        if self.enabled:
            self.accelerator = accelerator
            self.model = model
            self.local_sgd_steps = local_sgd_steps

    def __enter__(self) -> "LocalSGD":
        if self.enabled:
            self.model_sync_obj = self.model.no_sync()
            self.model_sync_obj.__enter__()
        return self

    def __exit__(self, type: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.enabled:
            self._sync_and_avg_model_params()
            self.model_sync_obj.__exit__(type, value, tb)

    def step(self) -> None:
        """Count a step; on every ``local_sgd_steps``-th, average the parameters over the processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
