"""Rules of N-D parallelism that a GPU breaks obscurely, named on the mock GPU where the script breaks them.

- **context parallelism's sequence split** (issue 34, item 3): ``context_parallel`` (HF accelerate's
  ``maybe_context_parallel``) shards each buffer's sequence dimension into equal parts, one per rank of the cp
  mesh, two with the default head-tail load balancing. A length that does not divide leaves the ranks' shards
  of different sizes, and the ring attention's exchanges then do not match: NCCL hangs or reads garbage, gloo
  aborts the rank ("Received data size doesn't match expected size"). On the mock, ``context_parallel`` raises a
  ValueError naming the sizes instead, at the script's line.
- **tensor parallelism's head split** (issue 34, item 3): a Transformers tensor-parallel plan splits the attention
  projections by rows (``colwise``), so each rank must hold whole heads: the tp degree must divide the model's
  attention heads and its key-value heads. Otherwise a rank's query rows are not a multiple of the head size and
  the attention's reshape fails in the first forward, on a GPU as on the mock, with a shape error naming neither
  the heads nor the tp degree. On the mock, ``from_pretrained(tp_plan=...)`` raises a ValueError naming them, where
  Transformers applies the plan (4.x ``distribute_model``, 5.x ``apply_tensor_parallelism``).

The rules wrap torch's and Transformers' functions when their module is first imported
(:func:`simulators.devices.families.import_hooks.after_import`).
"""
from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import torch

from simulators.devices.families.import_hooks import after_import

#: Where torch shards context parallelism's buffers (``_context_parallel_buffers``).
CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
#: The load balancer whose rearrangement takes two equal parts of the sequence per rank.
HEAD_TAIL = "_HeadTailLoadBalancer"
#: Where Transformers applies a model's tensor-parallel plan, module -> function: 4.x ``distribute_model(model,
#: distributed_config, device_mesh, tp_size)``, 5.x ``apply_tensor_parallelism(model, tp_mesh, tp_plan)`` (the tp
#: degree is read from the arguments by name: ``tp_size``, else the mesh's size).
TP_MODULES = {
    "transformers.integrations.tensor_parallel": "distribute_model",
    "transformers.distributed.tensor_parallel": "apply_tensor_parallelism",
}


def install() -> None:
    """Arm every rule of this module in this process."""
    after_import(CP_MODULE, _check_sequence_split)
    for module, function in TP_MODULES.items():
        after_import(module, lambda loaded, function=function: _check_head_split(loaded, function))


def _check_sequence_split(module: ModuleType) -> None:
    shard = module._context_parallel_buffers

    def checked(mesh: Any, buffers: list, buffer_seq_dims: list[int], load_balancer: Any = None) -> list:
        ranks = mesh.size()
        parts = ranks * (2 if type(load_balancer).__name__ == HEAD_TAIL else 1)
        for position, (buffer, dim) in enumerate(zip(buffers, buffer_seq_dims)):
            if isinstance(buffer, torch.Tensor) and buffer.shape[dim] % parts:
                balanced = " (load balancing: two per rank)" if parts != ranks else ""
                raise ValueError(
                    f"context parallelism over {ranks} ranks splits each buffer's sequence into {parts} equal parts"
                    f"{balanced}, but buffer {position} has {buffer.shape[dim]} along dimension {dim}, which {parts} "
                    "does not divide (simulators: on GPUs the ranks' shards would differ in size and the ring "
                    "attention's exchanges would not match)")
        return shard(mesh, buffers, buffer_seq_dims, load_balancer)

    module._context_parallel_buffers = checked


def _check_head_split(module: ModuleType, function: str) -> None:
    apply = getattr(module, function, None)
    if apply is None:  # the other major version's module of that name
        return
    signature = inspect.signature(apply)

    def checked(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs).arguments
        mesh = given.get("device_mesh", given.get("tp_mesh"))
        _require_whole_heads(given["model"], given.get("tp_size") or mesh.size())
        return apply(*args, **kwargs)

    setattr(module, function, checked)


def _require_whole_heads(model: Any, ranks: int) -> None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(config, "num_attention_heads", None)
    if ranks <= 1 or heads is None:
        return
    counts = {"attention heads": heads, "key-value heads": getattr(config, "num_key_value_heads", None) or heads}
    uneven = {name: count for name, count in counts.items() if count % ranks}
    if uneven:
        found = " and ".join(f"{count} {name}" for name, count in uneven.items())
        raise ValueError(
            f"tensor parallelism over {ranks} ranks gives each rank whole attention heads only when {ranks} divides "
            f"the model's heads, but it has {found}, which {ranks} does not divide (simulators: on GPUs a rank would "
            "hold part of a head and the attention's reshape would fail in the first forward)")


__all__ = ["CP_MODULE", "TP_MODULES", "install"]
