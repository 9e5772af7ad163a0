"""The replicas of a mock XLA world and the gloo group their ``xm`` collectives run on.

Rules (the stand-in for torch-xla's PJRT runtime; catalog ``xla.collectives``):

- a replica is a rank of the simulator's world: ordinal ``RANK``, local
  ordinal ``LOCAL_RANK``, ``WORLD_SIZE`` replicas, host ``NODE_RANK``; with
  no launch environment, one replica;
- the collectives run on CPU tensors over a gloo group of their own, not
  torch.distributed's default group (XLA programs never create one; one an
  implementation creates is left alone): it is joined at the first
  collective, through a store that rank 0 hosts at ``MASTER_ADDR:MASTER_PORT``
  and that lives as long as the process;
- :func:`store` is that store, shared with the ``xla://`` init method of
  ``torch_xla.distributed.xla_backend`` (a torch.distributed group an
  implementation makes on XLA rendezvouses there, never on a second port);
- in no-compute mode (meta payloads, :mod:`simulators.devices.no_compute.meta_payloads`) a
  collective moves nothing: the replicas exchange its descriptor (op, dtype,
  shapes) and a mismatch raises, naming each replica's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from simulators.devices.no_compute import meta_payloads

#: How long a collective or the store waits for the other replicas (XLA itself waits forever).
TIMEOUT = timedelta(minutes=30)

_state: dict[str, object] = {}


@dataclass(frozen=True)
class Replicas:
    """Where this process stands in the world, read from the launch environment."""

    ordinal: int
    local_ordinal: int
    world_size: int
    local_world_size: int
    host: int

    @classmethod
    def from_environ(cls) -> Replicas:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(
            ordinal=int(os.environ.get("RANK", "0")),
            local_ordinal=int(os.environ.get("LOCAL_RANK", "0")),
            world_size=world_size,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))),
            host=int(os.environ.get("NODE_RANK", "0")),
        )


def replicas() -> Replicas:
    return Replicas.from_environ()


def store() -> dist.Store:
    """The world's store (created at the first call; rank 0 hosts it)."""
    if "store" not in _state:
        me = replicas()
        if "MASTER_PORT" not in os.environ:
            raise RuntimeError(
                f"simulators: XLA replica {me.ordinal} of {me.world_size} needs MASTER_ADDR/MASTER_PORT "
                "to meet the others (start the world with the simulator or torchrun)"
            )
        _state["store"] = dist.TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ["MASTER_PORT"]),
            me.world_size,
            is_master=me.ordinal == 0,
            timeout=TIMEOUT,
            wait_for_workers=False,
        )
    return _state["store"]  # type: ignore[return-value]


def _group() -> dist.ProcessGroupGloo:
    if "group" not in _state:
        me = replicas()
        prefixed = dist.PrefixStore("simulators/xla/replicas", store())
        _state["group"] = dist.ProcessGroupGloo(prefixed, me.ordinal, me.world_size, TIMEOUT)
    return _state["group"]  # type: ignore[return-value]


_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mul": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "and": dist.ReduceOp.BAND,
    "or": dist.ReduceOp.BOR,
}


def all_reduce(tensors: list[torch.Tensor], reduce_type: str) -> None:
    """Reduce CPU ``tensors`` in place across the replicas with ``reduce_type`` (``"sum"``, ``"max"``, ...)."""
    if reduce_type not in _REDUCE_OPS:
        raise ValueError(f"unknown XLA reduce type {reduce_type!r}; choose one of {sorted(_REDUCE_OPS)}")
    if replicas().world_size == 1:
        return
    if _checked_without_compute("all_reduce", tensors):
        return
    options = dist.AllreduceOptions()
    options.reduceOp = _REDUCE_OPS[reduce_type]
    for tensor in tensors:
        _group().allreduce([tensor], options).wait()


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every replica's CPU ``tensor``, in ordinal order; every replica must pass the same shape."""
    world_size = replicas().world_size
    if world_size == 1:
        return [tensor.clone()]
    shapes = _gather_shapes(tensor)
    if len(set(shapes)) > 1:
        raise RuntimeError(
            "simulators: XLA all_gather needs the same shape on every replica, got "
            + ", ".join(f"replica {ordinal}: {list(shape)}" for ordinal, shape in enumerate(shapes))
        )
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    if tensor.is_meta:  # no-compute mode: the shapes were compared, nothing to move
        return parts
    _group().allgather([parts], [tensor.contiguous()]).wait()
    return parts


def broadcast(tensor: torch.Tensor, root: int) -> None:
    """Overwrite CPU ``tensor`` in place with replica ``root``'s."""
    if replicas().world_size == 1:
        return
    if _checked_without_compute("broadcast", [tensor]):
        return
    options = dist.BroadcastOptions()
    options.rootRank = root
    _group().broadcast([tensor], options).wait()


def _checked_without_compute(name: str, tensors: list[torch.Tensor]) -> bool:
    """For meta ``tensors`` (no-compute mode): compare the replicas' descriptors of op ``name`` and move nothing
    (True); False for CPU tensors."""
    if not tensors or not tensors[0].is_meta:
        return False
    mine = meta_payloads.describe(name, (tensors,))
    descriptors = [text.decode(errors="replace") for text in exchange(mine.encode())]
    meta_payloads.compare(name, "xla replicas", replicas().ordinal, descriptors)
    return True


def exchange(payload: bytes) -> list[bytes]:
    """Every replica's ``payload``, in ordinal order (payloads may differ in length)."""
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    sizes = [int(size) for size in all_gather(torch.tensor([data.numel()]))]
    if max(sizes) == 0:
        return [b"" for _ in sizes]
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: data.numel()] = data
    gathered = all_gather(padded)
    return [bytes(part[:size].tolist()) for part, size in zip(gathered, sizes)]


def _gather_shapes(tensor: torch.Tensor) -> list[tuple[int, ...]]:
    """Every replica's shape of ``tensor`` (up to 8 dimensions)."""
    if tensor.dim() > 8:
        raise ValueError(f"simulators: XLA all_gather of a {tensor.dim()}-d tensor (at most 8 dimensions)")
    mine = torch.full((9,), -1, dtype=torch.int64)
    mine[0] = tensor.dim()
    mine[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    parts = [torch.empty_like(mine) for _ in range(replicas().world_size)]
    _group().allgather([parts], [mine]).wait()
    return [tuple(part[1 : 1 + int(part[0])].tolist()) for part in parts]
