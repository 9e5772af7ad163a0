"""What a device family provides to the process state."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..utils.dataclasses import DistributedType


@dataclass(frozen=True)
class LaunchEnv:
    """The torchrun-style launch contract as read from the environment.

    ``WORLD_SIZE`` greater than one means the process is one rank of a
    distributed launch; everything else is a single process.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls) -> "LaunchEnv":
        def read(name: str, default: int) -> int:
            value = os.environ.get(name, "")
            try:
                return int(value) if value != "" else default
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer") from None

        world_size = read("WORLD_SIZE", 1)
        if world_size < 1:
            raise ValueError(f"WORLD_SIZE must be at least 1, got {world_size}")
        return cls(
            rank=read("RANK", 0),
            world_size=world_size,
            local_rank=read("LOCAL_RANK", 0),
            local_world_size=read("LOCAL_WORLD_SIZE", world_size),
        )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


class DeviceFamily:
    """A kind of device and the process-group backend that connects its ranks.

    Subclasses set the class attributes and override what differs; the
    defaults describe a torch.distributed backend initialised from the
    torchrun environment. A family holds no instance state, so two instances
    of one family are equal: a pickled state's copy equals the original, as
    HF 1.15's state dicts do (HF's test_distributed_data_loop.py).
    """

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    #: Short name, also the torch device type (``"cpu"``, ``"cuda"``, ...).
    name: str = ""
    #: ``torch.distributed`` backend used between ranks of this family.
    backend: str = ""
    #: The distributed type reported when more than one rank runs.
    distributed_type: DistributedType = DistributedType.NO
    #: ``init_method`` of ``torch.distributed.init_process_group`` (None: the torchrun environment).
    init_method: str | None = None

    def is_available(self) -> bool:
        raise NotImplementedError

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        """The device a rank with this local index computes on."""
        raise NotImplementedError

    def backend_for(self, requested: str | None) -> str:
        """The backend this family's ranks join with when ``requested`` (None: not chosen) is asked for.

        Rule (HF 1.15's `PartialState`): the family's own backend; families
        that can run another one (CUDA, CPU with MPI) override this.
        """
        return self.backend

    def init_process_group(self, launch: LaunchEnv, backend: str | None, **kwargs: Any) -> None:
        """Join the process group of the launch, unless already joined.

        A process group that already exists (a previous state in the same
        process, or one made by the caller) is reused as it is.
        """
        if dist.is_initialized():
            return
        kwargs.setdefault("timeout", timedelta(minutes=30))
        if self.init_method is not None:
            kwargs.setdefault("init_method", self.init_method)
        dist.init_process_group(
            backend=backend or self.backend,
            rank=launch.rank,
            world_size=launch.world_size,
            **kwargs,
        )

    def world(self, launch: LaunchEnv) -> tuple[int, int, int]:
        """``(num_processes, process_index, local_process_index)`` once joined."""
        return dist.get_world_size(), dist.get_rank(), launch.local_rank

    def barrier(self) -> None:
        """Block until every rank has arrived (catalog ``sync.wait_for_everyone``)."""
        dist.barrier()

    def move_module(self, module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """``module`` on ``device``, its parameters keeping their identity (catalog ``prepare.order``).

        An optimizer made before `prepare` holds the parameters themselves, so
        a move must not replace them; on CPU and CUDA ``Module.to`` moves them in place.
        """
        return module.to(device)


def device_of_local_rank(device_type: str, device_module: Any, local_rank: int, distributed: bool) -> torch.device:
    """The device a rank computes on when each machine's ranks share its devices, made current.

    Rule: in a distributed launch local rank ``r`` takes device ``r % device_count``;
    a single process keeps the current device. ``device_module`` is ``torch.cuda``,
    ``torch.npu``, ...: it has ``device_count``, ``current_device`` and ``set_device``.
    """
    index = local_rank % device_module.device_count() if distributed else device_module.current_device()
    device = torch.device(device_type, index)
    device_module.set_device(device)
    return device
