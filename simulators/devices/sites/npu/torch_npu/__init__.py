"""Stand-in for torch_npu (the accelerate-ref simulator's mock Ascend NPU).

Importing it installs the mock (see :mod:`simulators.devices.families.npu`): the
``npu`` device, ``torch.npu`` (:mod:`torch_npu.npu`) and the ``hccl``
process-group backend, served by gloo.
"""
from __future__ import annotations

from simulators.devices.families import backend as _backend
from simulators.devices.families import npu as _mock
from torch_npu import npu

_mock.install(npu)

__version__ = _mock.VERSION


def _autoload() -> None:
    """torch's ``torch.backends`` entry point, called after the import installed the mock: what the launch's
    environment asks of it."""
    _backend.apply_launch_environment()


def npu_fusion_attention(*args, **kwargs):
    """Ascend's fused attention kernel: importable (Transformers imports it when torch_npu is present), not runnable."""
    raise NotImplementedError("npu_fusion_attention is an Ascend kernel; the simulator's mock NPU does not run it")
