"""Stand-in that puts the accelerate-ref simulator's mock CUDA GPUs into a CPU-only torch.

torch imports it at ``import torch`` through its ``torch.backends`` entry
point (as it loads torch_npu), so a script sees ``torch.cuda.is_available()``
from its first line; importing it installs the mock (see
:mod:`simulators.devices.families.cuda`): ``cuda`` tensors, ``torch.cuda`` and the
``nccl`` process-group backend, served by gloo.
"""
from __future__ import annotations

from simulators.devices.families import backend as _backend
from simulators.devices.families import cuda as _mock

_mock.install()

__version__ = _mock.VERSION


def _autoload() -> None:
    """torch's ``torch.backends`` entry point, called after the import installed the mock: what the launch's
    environment asks of it."""
    _backend.apply_launch_environment()
