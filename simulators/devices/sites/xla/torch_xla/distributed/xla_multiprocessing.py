"""``torch_xla.distributed.xla_multiprocessing`` (``xmp``): one process per XLA device.

Rules: inside a world the simulator started, every rank is already the
process of its device, so ``spawn(fn, args)`` calls ``fn(local ordinal,
*args)`` right there. Outside one, it starts a simulator world of
``CPU_NUM_DEVICES`` ranks (default 1: ``fn(0, *args)`` in this process)
with the stand-in ``torch_xla`` on their path; ``fn`` must then be a
module-level function.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from simulators.devices import world_settings
from torch_xla import runtime


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int | None = None, join: bool = True,
          daemon: bool = False, start_method: str = "spawn") -> None:
    """Run ``fn(index, *args)`` on every device."""
    devices = int(os.environ.get("CPU_NUM_DEVICES", "1"))
    if "RANK" in os.environ or devices == 1 or nprocs == 1:
        fn(runtime.local_ordinal(), *args)
        return
    from simulators import launcher
    from simulators.spawn import child_pythonpath

    settings = world_settings("xla")
    env = {**settings.env, "PYTHONPATH": child_pythonpath(settings.pythonpath)}
    launcher.run(_call_with_index, world=devices, args=(fn, args), env=env, timeout=float("inf"))


def _call_with_index(fn: Callable[..., Any], args: tuple) -> None:
    fn(runtime.local_ordinal(), *args)


class MpModelWrapper:
    """Holds a model for the processes of ``spawn``; ``to(device)`` returns it moved."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def to(self, device: str | torch.device) -> torch.nn.Module:
        return self._model.to(device)
