"""``torch_xla._XLAC``: the bindings of torch-xla's C extension that libraries call directly.

Only those seen in use: ``huggingface_hub`` tells tensors apart by
``_xla_get_tensor_id`` (XLA tensors have no storage to compare).
"""
from __future__ import annotations

import torch

from simulators.devices.families import xla as _mock


def _xla_get_tensor_id(tensor: torch.Tensor) -> int:
    """A number that identifies ``tensor`` among the live XLA tensors."""
    return id(_mock.require_xla([tensor], "_XLAC._xla_get_tensor_id")[0]._payload)


def _xla_get_default_device() -> str:
    return f"xla:{_mock.XlaTensor.current_index()}"
