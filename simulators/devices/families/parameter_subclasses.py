"""Parameter subclasses made of mock-device data: bitsandbytes' ``Params4bit`` and ``Int8Params`` on a mock GPU.

A library's own ``Parameter`` subclass makes its instances with
``torch.Tensor._make_subclass(cls, data)`` (bitsandbytes/nn/modules.py:
``Params4bit.__new__``, ``Int8Params.__new__``, ``Params4bit.from_prequantized``).
On a GPU ``data`` is a plain tensor and the result is a ``Params4bit`` on the
GPU. A mock tensor is a wrapper subclass already bound to its Python object, so
torch refuses ("Creating a new Tensor subclass Params4bit but the raw Tensor
object is already associated to a python object of type CudaTensor").

Rules:

- ``_make_subclass(cls, data)`` with ``data`` on a mock device makes an
  instance of ``cls`` and of ``data``'s family at once (a class of both, named
  as ``cls``, made once per pair): ``isinstance(param, bnb.nn.Params4bit)``
  holds, its attributes (``quant_state``, ``blocksize``...) are its own, and it
  sits on ``data``'s device with ``data``'s payload, which the memory books
  already count (the same storage, counted once);
- an op on such a parameter gives plain tensors of the family, as an op on a
  ``Params4bit`` gives plain tensors on a GPU (``Parameter`` disables the
  torch-function subclass wrapping): results are made of
  :func:`simulators.devices.families.tensor.family_of` the joined class;
- ``Module.to`` / ``Module._apply`` moves such a parameter as on a GPU, through
  ``param.data = moved`` (the parameter object and its attributes stay), not
  by swapping in ``Parameter(moved)``, which torch does for wrapper subclasses
  and which a ``Params4bit`` refuses (its ``detach()`` is a plain tensor).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.modules.module
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from simulators.devices.families.tensor import DeviceTensor, family_of

#: torch's own ``Tensor._make_subclass``.
_MAKE_SUBCLASS = torch.Tensor._make_subclass


@functools.cache
def _joined(cls: type, family: type[DeviceTensor]) -> type:
    """The class of a ``cls`` instance on ``family``'s device (``cls`` first: its methods win)."""
    return type(cls.__name__, (cls, family), {"_family": family, "__module__": cls.__module__})


def _make_subclass(cls: type, data: torch.Tensor, requires_grad: bool = False, **kwargs: Any) -> torch.Tensor:
    """``torch.Tensor._make_subclass``, which takes mock-device data (see the module docstring). Its parameters are
    torch's own, names and defaults: torch._dynamo's stand-in for it checks that they match."""
    if not isinstance(data, DeviceTensor):
        return _MAKE_SUBCLASS(cls, data, requires_grad, **kwargs)
    tensor = DeviceTensor.__new__(_joined(cls, family_of(type(data))), data._payload, data.device_index)
    tensor.requires_grad_(requires_grad)
    return tensor


def _swapped_by_apply(tensor: Any) -> bool:
    """``Module._apply``'s test for swapping a moved parameter in: a wrapper subclass's parameter is swapped, except a
    library parameter subclass on a mock device, set through ``.data`` as on a GPU (see the module docstring)."""
    return family_of(type(tensor)) is type(tensor) and is_traceable_wrapper_subclass(tensor)


def install() -> None:
    """Let ``torch.Tensor._make_subclass`` take mock-device data, and ``Module._apply`` move what it makes (see the
    module docstring)."""
    torch.Tensor._make_subclass = staticmethod(_make_subclass)
    torch.nn.modules.module.is_traceable_wrapper_subclass = _swapped_by_apply
