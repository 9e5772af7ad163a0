"""The mock NPU device (Ascend-shaped worlds): ``npu`` tensors, their generators, ``hccl`` over gloo.

The stand-in ``torch_npu`` package (``sites/npu/torch_npu``) is what
implementations import (HF accelerate finds it with
``importlib.util.find_spec``; torch loads it at ``import torch`` through its
``torch.backends`` entry point, as the real torch_npu does); importing it
calls :func:`install` with its ``torch.npu`` module.

Rules (catalog ``npu.distributed_type``, ``npu.collectives``):

- PrivateUse1 becomes the ``npu`` device: ``torch.device("npu", i)``,
  ``Tensor.npu()``, ``Module.to("npu:1")`` work, and an `NpuTensor` follows
  :mod:`simulators.devices.families.tensor` (mixing with CPU tensors raises);
- a rank sees ``SIMULATORS_NPU_DEVICE_COUNT`` NPUs of its own, or, without
  it, one per rank of its host (``LOCAL_WORLD_SIZE``; each rank drives one);
  each has the memory budget of ``SIMULATORS_DEVICE_MEMORY``
  (:mod:`simulators.devices.families.machine`, :mod:`simulators.devices.memory.books`);
  the current device (``torch.npu.set_device``, 0 until set) is where
  ``"npu"`` and ``"npu:0"`` put tensors (see
  :meth:`simulators.devices.families.tensor.DeviceTensor.index_of`);
- ``init_process_group("hccl")`` makes a gloo group (``hccl`` is Ascend's
  collective library; here gloo runs on the tensors' CPU payloads);
- random ops on an NPU tensor draw from that device's generator
  (``torch.npu.manual_seed``; ``torch.manual_seed`` seeds every NPU too);
- ``Module.to("npu")`` keeps the module's parameter objects, as with
  torch_npu (whose tensors share the CPU's tensor type): an `NpuTensor` is a
  traceable wrapper subclass (``__tensor_flatten__``), which torch's
  ``Module._apply`` swaps into the existing parameters.
"""
from __future__ import annotations

from types import ModuleType

from simulators.devices.families import backend
from simulators.devices.memory.books import DeviceMemory
from simulators.devices.families.runtime import DeviceRuntime, RuntimeTensor

#: The version the stand-in reports.
VERSION = "2.13.0+sim"


class NpuTensor(RuntimeTensor):
    """A tensor on the mock ``npu`` device."""

    device_type = "npu"
    memory = DeviceMemory("npu")


#: ``torch.npu``'s device API in this process (current NPU, generators, memory queries).
RUNTIME = DeviceRuntime(NpuTensor)


def install(device_module: ModuleType) -> None:
    """Make ``npu`` tensors work in this process, with ``device_module`` as ``torch.npu``."""
    backend.install(NpuTensor, "npu", device_module)
    backend.register_process_group_backend("hccl")
