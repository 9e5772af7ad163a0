"""Stand-in for torch-xla 2.9 (the accelerate-ref simulator's mock XLA device).

Importing it installs the mock: ``xla`` tensors over CPU payloads and
collectives over gloo (see :mod:`simulators.devices.families.xla`). It provides
what implementations call, with torch-xla 2.9's names: ``torch_xla.device``,
``torch_xla.sync``, ``torch_xla.launch``, ``torch_xla.runtime``,
``torch_xla.core.xla_model``, ``torch_xla.distributed.parallel_loader``,
``torch_xla.distributed.xla_multiprocessing``,
``torch_xla.distributed.xla_backend``, ``torch_xla.debug.metrics`` and the
few ``torch_xla._XLAC`` bindings libraries call.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from simulators.devices.families import backend as _backend
from simulators.devices.families import xla as _mock

_mock.install()
_backend.apply_launch_environment()  # no entry point: torch never autoloads torch_xla

from torch_xla import _XLAC  # noqa: E402 (the C extension's stand-in, after the install)

__version__ = _mock.VERSION


def device(index: int | None = None) -> torch.device:
    """This replica's XLA device (``xla:<local ordinal>``), or ``xla:<index>``."""
    from torch_xla import runtime

    return runtime.xla_device(index)


def sync(wait: bool = False) -> None:
    """End the step: run (compiling if needed) the graph traced since the last one."""
    from torch_xla.core import xla_model

    xla_model.mark_step(wait)


def launch(fn: Callable[..., Any], args: tuple = (), start_method: str = "spawn", debug_single_process: bool = False) -> None:
    """Run ``fn(*args)`` on every device (every rank of the simulator's world)."""
    from torch_xla.distributed import xla_multiprocessing

    xla_multiprocessing.spawn(_WithoutIndex(fn), args=args, start_method=start_method)


class _WithoutIndex:
    """``fn`` called as ``spawn`` calls its target, with the index dropped (picklable)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, index: int, *args: Any) -> Any:
        return self.fn(*args)


__all__ = ["_XLAC", "__version__", "device", "launch", "sync"]
