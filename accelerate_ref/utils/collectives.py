"""The primitive collectives that `operations` builds on, one backend per world kind.

`operations` walks nested structures and applies the documented rules;
this module only moves single tensors and picklable objects between ranks.
Which backend a process uses is decided in one place, `collectives_for`:

* one process (`DistributedType.NO`, or a world of 1): `LocalCollectives`,
  where every collective is the identity on this rank's data;
* every torch.distributed family (MULTI_CPU over gloo, MULTI_GPU, MULTI_NPU,
  DEEPSPEED, FSDP, ...): `TorchDistributedCollectives`;
* XLA: not provided yet; a backend for it implements `Collectives` and gets
  an entry in `collectives_for`.

Catalog: gather.first_dim, gather_object.nested, reduce.mean,
broadcast.from_process, broadcast_object_list.in_place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .dataclasses import DistributedType

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..state import PartialState


class Collectives:
    """Collectives over one tensor or one picklable object, identical on every rank.

    Tensors passed in are contiguous, and at least 1-d for `all_gather`
    (operations ensures it). Catalog: gather.first_dim, reduce.mean,
    broadcast.from_process, broadcast_object_list.in_place.
    """

    num_processes: int = 1

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` concatenated along dim 0, in rank order."""
        raise NotImplementedError

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """A new tensor holding the element-wise sum of every rank's `tensor`."""
        raise NotImplementedError

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrite `tensor` in place with rank `src`'s."""
        raise NotImplementedError

    def all_gather_object(self, obj: Any) -> list[Any]:
        """The list of every rank's `obj`, in rank order."""
        raise NotImplementedError

    def broadcast_object_list(self, objects: list[Any], src: int) -> None:
        """Overwrite the items of `objects` in place with rank `src`'s."""
        raise NotImplementedError


class LocalCollectives(Collectives):
    """A world of one process: every collective returns this rank's own data.

    Catalog: gather.first_dim, reduce.mean, broadcast.from_process (at world 1).
    """

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        pass  # the only rank is the source

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object_list(self, objects: list[Any], src: int) -> None:
        pass  # the only rank is the source


class TorchDistributedCollectives(Collectives):
    """Collectives of the default `torch.distributed` process group (gloo, nccl, hccl, ...).

    Catalog: gather.first_dim, gather_object.nested, reduce.mean,
    broadcast.from_process, broadcast_object_list.in_place.
    """

    def __init__(self, num_processes: int) -> None:
        self.num_processes = num_processes

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        # all_gather into a list works on every backend (gloo lacks all_gather_into_tensor).
        parts = [torch.empty_like(tensor) for _ in range(self.num_processes)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts, dim=0)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        dist.all_reduce(result, op=dist.ReduceOp.SUM)
        return result

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        dist.broadcast(tensor, src=src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.num_processes
        dist.all_gather_object(gathered, obj)
        return gathered

    def broadcast_object_list(self, objects: list[Any], src: int) -> None:
        dist.broadcast_object_list(objects, src=src)


def collectives_for(state: PartialState) -> Collectives:
    """The collectives backend of the world `state` describes.

    Rule: a single process gets `LocalCollectives`; XLA is refused with a
    NotImplementedError naming it; every other distributed type runs on the
    initialised torch.distributed process group.
    Catalog: gather.first_dim, reduce.mean, broadcast.from_process.
    """
    if not state.use_distributed:
        return LocalCollectives()
    if state.distributed_type == DistributedType.XLA:
        raise NotImplementedError("collectives for DistributedType.XLA are not implemented in accelerate_ref yet")
    return TorchDistributedCollectives(state.num_processes)
