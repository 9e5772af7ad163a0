"""Rules of N-D parallelism that a GPU breaks obscurely, named on the mock GPU where the script breaks them.

- **context parallelism's sequence split** (issue 34, item 3): ``context_parallel`` (HF accelerate's
  ``maybe_context_parallel``) shards each buffer's sequence dimension into equal parts, one per rank of the cp
  mesh, two with the default head-tail load balancing. A length that does not divide leaves the ranks' shards
  of different sizes, and the ring attention's exchanges then do not match: NCCL hangs or reads garbage, gloo
  aborts the rank ("Received data size doesn't match expected size"). On the mock, ``context_parallel`` raises a
  ValueError naming the sizes instead, at the script's line.

The rules wrap torch's functions when their module is first imported (:func:`after_import`), so a process that
never uses them does not pay for importing them.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable

import torch

#: Where torch shards context parallelism's buffers (``_context_parallel_buffers``).
CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
#: The load balancer whose rearrangement takes two equal parts of the sequence per rank.
HEAD_TAIL = "_HeadTailLoadBalancer"


def install() -> None:
    """Arm every rule of this module in this process."""
    after_import(CP_MODULE, _check_sequence_split)


def after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Call ``patch`` with module ``name`` once it is imported (now, if it already is)."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _Patching(name, patch))


class _Patching(importlib.abc.MetaPathFinder):
    """Finds module ``name`` as the other finders do, and patches it after its code has run."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


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


__all__ = ["CP_MODULE", "install", "after_import"]
