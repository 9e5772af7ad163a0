"""``torch_xla.runtime``: the replica's place in the world (torch-xla 2.9's PJRT runtime API).

A replica is a rank of the simulator's world (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``NODE_RANK``), with one device each; ``device_type()`` is
``PJRT_DEVICE`` (``"CPU"`` unless the world says ``"TPU"``).
"""
from __future__ import annotations

import torch

from simulators.devices.families import xla as _mock
from simulators.devices.families.replicas import replicas


def device_type() -> str:
    return _mock.device_type()


def using_pjrt() -> bool:
    return True


def world_size() -> int:
    """Replicas in the world."""
    return replicas().world_size


def global_ordinal() -> int:
    """This replica's ordinal, 0 to ``world_size() - 1``."""
    return replicas().ordinal


def local_ordinal() -> int:
    """This replica's ordinal on its host."""
    return replicas().local_ordinal


def local_device_count() -> int:
    """Devices on this host."""
    return replicas().local_world_size


def addressable_device_count() -> int:
    """Devices this process drives (one per replica process)."""
    return 1


def global_device_count() -> int:
    return replicas().world_size


def global_runtime_device_count() -> int:
    return replicas().world_size


def process_index() -> int:
    return replicas().ordinal


def process_count() -> int:
    return replicas().world_size


def host_index() -> int:
    return replicas().host


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """``xla:<n>``, by default this replica's device ``xla:<local ordinal>``."""
    return torch.device("xla", local_ordinal() if n is None else n)
