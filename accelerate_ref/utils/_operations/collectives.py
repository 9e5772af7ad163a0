"""The primitive collectives that `operations` builds on, one backend per world kind.

`operations` walks nested structures and applies the documented rules;
this module only moves single tensors and picklable objects between ranks.
Which backend a process uses is decided in one place, `collectives_for`:

* one process (`DistributedType.NO`, or a world of 1): `LocalCollectives`,
  where every collective is the identity on this rank's data;
* every torch.distributed family (MULTI_CPU over gloo, MULTI_GPU, MULTI_NPU,
  DEEPSPEED, FSDP, ...): `TorchDistributedCollectives`;
* XLA: `XlaCollectives`, through torch-xla's ``xm``.

Catalog: gather.first_dim, gather_object.nested, reduce.mean,
broadcast.from_process, broadcast_object_list.in_place, xla.collectives.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from ..dataclasses import DistributedType

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...state import PartialState


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

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """A new tensor holding the element-wise maximum of every rank's `tensor` (through `all_gather`)."""
        return self.all_gather(tensor.unsqueeze(0)).amax(dim=0)

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
        """Into one flat tensor with ``all_gather_into_tensor`` (torch's FutureWarning included), as HF 1.15
        does, except on gloo, which lacks it: there into a list of tensors."""
        if dist.get_backend() == "gloo":
            parts = [torch.empty_like(tensor) for _ in range(self.num_processes)]
            dist.all_gather(parts, tensor)
            return torch.cat(parts, dim=0)
        flat = torch.empty(self.num_processes * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(flat, tensor)
        return flat.view(-1, *tensor.shape[1:])

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        dist.all_reduce(result, op=dist.ReduceOp.SUM)
        return result

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        result = tensor.clone()
        dist.all_reduce(result, op=dist.ReduceOp.MAX)
        return result

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        dist.broadcast(tensor, src=src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.num_processes
        dist.all_gather_object(gathered, obj)
        return gathered

    def broadcast_object_list(self, objects: list[Any], src: int) -> None:
        dist.broadcast_object_list(objects, src=src)


class XlaCollectives(Collectives):
    """Collectives of an XLA world, through torch-xla's ``xla_model`` (``xm``), never torch.distributed.

    Rules: tensors go through the XLA `device` (a tensor elsewhere, e.g. on
    the CPU, travels there and its result comes back to where it was);
    gather is ``xm.all_gather``, the sum is ``xm.all_reduce(REDUCE_SUM)``,
    broadcast is ``xm.collective_broadcast``; objects travel with
    ``xm.mesh_reduce`` (pickled on the host), so ``gather_object`` works on
    XLA as the documents say (HF 1.15 refuses it there).
    Catalog: xla.collectives, gather.first_dim, gather_object.nested,
    reduce.mean, broadcast.from_process, broadcast_object_list.in_place.
    """

    def __init__(self, num_processes: int, device: torch.device) -> None:
        self.num_processes = num_processes
        self.device = device
        self.xm = importlib.import_module("torch_xla.core.xla_model")

    def _on_device(self, tensor: torch.Tensor, operation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return operation(tensor.to(self.device)).to(tensor.device)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._on_device(tensor, self.xm.all_gather)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._on_device(tensor, lambda on_device: self.xm.all_reduce(self.xm.REDUCE_SUM, on_device))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        on_device = tensor.to(self.device)
        self.xm.collective_broadcast([on_device], root_ordinal=src)
        if on_device is not tensor:
            tensor.copy_(on_device)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self.xm.mesh_reduce("accelerate_ref.gather_object", obj, list)

    def broadcast_object_list(self, objects: list[Any], src: int) -> None:
        objects[:] = self.xm.mesh_reduce("accelerate_ref.broadcast_object_list", objects, lambda every: every[src])


def collectives_for(state: PartialState) -> Collectives:
    """The collectives backend of the world `state` describes.

    Rule: a single process gets `LocalCollectives`; XLA gets `XlaCollectives`;
    every other distributed type runs on the initialised torch.distributed
    process group.
    Catalog: gather.first_dim, reduce.mean, broadcast.from_process, xla.collectives.
    """
    if not state.use_distributed:
        return LocalCollectives()
    if state.distributed_type == DistributedType.XLA:
        return XlaCollectives(state.num_processes, state.device)
    return TorchDistributedCollectives(state.num_processes)
