"""``torch_xla.distributed.xla_backend``: torch.distributed on XLA devices.

Importing it lets ``torch.distributed.init_process_group("xla",
init_method="xla://")`` make a process group (torch-xla's way to run
``DistributedDataParallel`` on XLA). The mock's ``xla`` backend is gloo on
the tensors' CPU payloads; ``xla://`` rendezvouses through the XLA
runtime's own store (:func:`simulators.devices.families.replicas.store`), each group
under a fresh prefix.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

import torch.distributed as dist

from simulators.devices.families import backend
from simulators.devices.families import replicas as _replicas

_groups = itertools.count()


def _xla_rendezvous(url: str, timeout: Any = None, **kwargs: Any) -> Iterator[tuple[dist.Store, int, int]]:
    me = _replicas.replicas()
    yield dist.PrefixStore(f"simulators/xla/group{next(_groups)}", _replicas.store()), me.ordinal, me.world_size


backend.register_process_group_backend("xla")
dist.register_rendezvous_handler("xla", _xla_rendezvous)
