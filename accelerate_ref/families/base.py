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
    torchrun environment.
    """

    #: Short name, also the torch device type (``"cpu"``, ``"cuda"``, ...).
    name: str = ""
    #: ``torch.distributed`` backend used between ranks of this family.
    backend: str = ""
    #: The distributed type reported when more than one rank runs.
    distributed_type: DistributedType = DistributedType.NO

    def is_available(self) -> bool:
        raise NotImplementedError

    def device(self, local_rank: int, distributed: bool) -> torch.device:
        """The device a rank with this local index computes on."""
        raise NotImplementedError

    def init_process_group(self, launch: LaunchEnv, backend: str | None, **kwargs: Any) -> None:
        """Join the process group of the launch, unless already joined.

        A process group that already exists (a previous state in the same
        process, or one made by the caller) is reused as it is.
        """
        if dist.is_initialized():
            return
        kwargs.setdefault("timeout", timedelta(minutes=30))
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
