"""The mock CUDA device (GPU-shaped worlds on a CPU-only torch): ``cuda`` tensors, ``torch.cuda``, ``nccl`` over gloo.

The stand-in package ``torch_cuda_sim`` (``sites/cuda``) carries a
``torch.backends`` entry point, so ``import torch`` installs the mock in a
rank whose import path starts with that site (as torch loads torch_npu);
HF accelerate and accelerate_ref then see CUDA and pick ``MULTI_GPU`` over
``nccl``. Rules (catalog: the dry runs of "Launching", ``accelerate-ref
launch --simulate cuda``):

- a `CudaTensor` reports ``device.type == "cuda"`` (``is_cuda`` too) and
  follows :mod:`simulators.devices.families.tensor` (mixing with CPU tensors raises
  ``Expected all tensors to be on the same device, but found at least two
  devices, cuda:0 and cpu!``, as on a GPU); ``torch.zeros(..., device="cuda")``,
  ``Tensor.to("cuda")``, ``.cuda()``, ``Module.to("cuda:1")`` and
  ``torch.tensor(data, device="cuda")`` make them;
- a rank sees ``SIMULATORS_CUDA_DEVICE_COUNT`` GPUs, or one per rank of its
  simulated machine; ``torch.cuda`` is the family's
  :class:`~simulators.devices.families.runtime.DeviceRuntime` (current device, per-GPU
  generators, memory books, streams and events that wait for nothing);
- ``torch.autocast("cuda", dtype)`` casts as torch's CUDA autocast does;
- ``init_process_group("nccl")`` (or with no backend, torch's default on
  GPUs; and ``new_group(backend="nccl")``) makes a gloo group that
  ``get_backend`` reports as ``nccl``. Its collectives run on the tensors'
  CPU payloads, so unlike nccl it also takes CPU tensors;
- ``Module.to("cuda")`` keeps the module's parameter objects, as on a GPU;
- ``Tensor.pin_memory()`` (``DataLoader(pin_memory=True)``) returns a host
  copy: the mock's device memory is host memory, and a Python backend gets
  no pinned-memory allocator from torch ("implement
  `getPinnedMemoryAllocator`" otherwise).

Why this takes more than the NPU mock (torch 2.13.0's CPU build):

1. The C++ side of a mock tensor is torch's PrivateUse1 device (here named
   ``cuda_sim``), as for the other families, with factory kernels for the
   ``CUDA`` dispatch key making them. But a device named without an index
   (``"cuda"``) meets C++ code that asks for the CUDA device guard to fill the
   index in (``at::native::to`` -> ``ensure_has_index`` ->
   ``c10::impl::getDeviceGuardImpl``: "PyTorch is not linked with support for
   cuda devices"). A CPU build registers no CUDA guard, Python may register
   one for PrivateUse1 only (``torch._C._acc``), and
   ``torch._C._ensureCUDADeviceGuardSet`` installs its fake one only in CUDA
   builds without a GPU. So a torch-function rule (`indexed_cuda`, in the
   mock's mode for the rank's life) gives every index-less ``cuda`` device the current
   GPU's index before torch's C++ side sees it. torch keeps modes per
   thread: in a thread the script starts itself, name the index
   (``"cuda:0"``, ``accelerator.device``).
2. ``init_process_group`` builds ``ProcessGroupNCCL`` for the name ``nccl``
   whatever backend is registered under it ("Distributed package doesn't
   have NCCL built in"), so the name is routed to a gloo backend registered
   as ``nccl_sim``.
3. torch's C++ side initialises CUDA by calling ``torch.cuda._lazy_init``
   ("Torch not compiled with CUDA enabled"): the runtime replaces it, with
   the rest of ``torch.cuda``'s device API. What lives in torch's CUDA
   library itself stays out of reach: ``torch.Generator(device="cuda")``
   ("Cannot get CUDA generator without ATen_cuda library") and the legacy
   ``torch.cuda.FloatTensor`` types.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.distributed as dist

from simulators.devices.kernels import attention, flash_attention, nd_rules
from simulators.devices.families import backend, import_hooks, tensor
from simulators.devices.memory import cuda_libraries, cuda_reduce
from simulators.devices.no_compute import foreach_sharding, mesh_concatenation
from simulators.devices.memory.books import DeviceMemory
from simulators.devices.families.runtime import DeviceRuntime, RuntimeTensor

#: The version the stand-in reports (the torch release whose ``torch.cuda`` API it follows).
VERSION = "2.13.0+sim"
#: PrivateUse1's name in CUDA worlds: the C++ side of a `CudaTensor` (users see ``cuda``).
HIDDEN_NAME = "cuda_sim"
#: The NCCL version ``torch.cuda.nccl.version()`` reports (the CPU build has none; the mock's nccl is gloo).
NCCL_VERSION = (2, 27, 5)
#: The gloo backend ``nccl`` is routed to.
NCCL_STAND_IN = "nccl_sim"


class CudaTensor(RuntimeTensor):
    """A tensor on the mock ``cuda`` device."""

    device_type = "cuda"
    memory = DeviceMemory("cuda")

    @property
    def is_cuda(self) -> bool:
        return True

    @classmethod
    def observe(cls, func: Any, tensors: list, args: tuple, kwargs: dict) -> None:
        """The library workspaces ``func`` takes on a GPU (:mod:`simulators.devices.memory.cuda_libraries`) and the
        staging buffer of a reduction split across blocks (:mod:`simulators.devices.memory.cuda_reduce`)."""
        cuda_libraries.observe(cls, func, tensors)
        cuda_reduce.observe(cls, func, args, kwargs)


#: ``torch.cuda``'s device API in this process.
RUNTIME = DeviceRuntime(CudaTensor)


def indexed_cuda(func: Callable, args: tuple, kwargs: dict, proceed: Callable) -> Any:
    """A torch-function rule (:func:`simulators.devices.families.tensor.add_function_rule`): gives an index-less ``cuda``
    device (``"cuda"``, ``torch.device("cuda")``, ``.cuda()``) the current GPU's index."""
    if kwargs.get("pin_memory"):  # host memory is host memory here (see _pinned); torch has no pinned allocator for the mock
        kwargs = {**kwargs, "pin_memory": False}
    if func is torch.Tensor.cuda:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        return proceed(func, (args[0],), {**kwargs, "device": torch.device("cuda", RUNTIME.index(device))})
    if func is not torch.device:
        args = tuple(_indexed(value) for value in args)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _indexed(kwargs["device"])}
    return proceed(func, args, kwargs)


class _Nvtx:
    """``torch._C._nvtx`` of the mock: ranges nest and end as NVTX's do, and mark nothing (no profiler sees them)."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = 0

    def rangePushA(self, msg: str) -> int:
        self.depth += 1
        return self.depth - 1

    def rangePop(self) -> int:
        self.depth = max(self.depth - 1, 0)
        return self.depth if self.depth else -1

    def rangeStartA(self, msg: str) -> int:
        self.started += 1
        return self.started

    def rangeEnd(self, range_id: int) -> None:
        pass

    def deviceRangeStart(self, msg: str, stream: Any) -> int:
        return self.rangeStartA(msg)

    def deviceRangeEnd(self, handle: int, stream: Any) -> None:
        pass

    def markA(self, msg: str) -> None:
        pass


def _cuda_accelerator() -> torch.device:
    """The accelerator a CUDA build of torch reports: ``cuda``."""
    return torch.device("cuda")


def _null_stream(device_index: int) -> int:
    """``torch._C._cuda_getCurrentRawStream``: the raw handle of the current stream, CUDA's null stream (0)."""
    return 0


def _pinned(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """``Tensor.pin_memory``: a copy in host memory (see the module docstring)."""
    return self.clone()


def _indexed(value: Any) -> Any:
    """``value`` with the current GPU's index if it is an index-less ``cuda`` device."""
    if isinstance(value, (str, torch.device)) and str(value) == "cuda":
        return torch.device("cuda", RUNTIME.current)
    return value


class _DeviceModule:
    """``torch.cuda_sim``: what torch asks of a PrivateUse1 backend's module."""

    is_available = staticmethod(RUNTIME.is_available)
    is_initialized = staticmethod(RUNTIME.is_initialized)
    device_count = staticmethod(RUNTIME.device_count)
    current_device = staticmethod(RUNTIME.current_device)
    _is_in_bad_fork = staticmethod(RUNTIME._is_in_bad_fork)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """``torch.manual_seed`` seeds the GPUs through ``torch.cuda.manual_seed_all``."""


def install() -> None:
    """Make ``cuda`` tensors, ``torch.cuda`` and ``nccl`` work in this process (see the module docstring)."""
    if backend.installed() is CudaTensor:
        return
    backend.install(CudaTensor, HIDDEN_NAME, _DeviceModule(), extra_keys=("CUDA",), autocast_aliases=("cuda",))
    for name, value in RUNTIME.api().items():
        setattr(torch.cuda, name, value)
    tensor.add_function_rule(indexed_cuda)
    # torch's own code asks which accelerator this build has (FSDP2's default mesh, torch.distributed's
    # default device): a CUDA build says ``cuda``, not the PrivateUse1 name (which a mesh refuses: not alphabetic).
    torch._C._get_accelerator = torch._C._accelerator_getAccelerator = _cuda_accelerator
    # ... and its streams through ``torch.accelerator`` (FSDP2's finalize_backward waits on the current stream there).
    torch.accelerator.current_stream, torch.accelerator.synchronize = RUNTIME.current_stream, RUNTIME.synchronize
    torch.Tensor.pin_memory = _pinned
    # bitsandbytes' CUDA backend reads the current stream's raw handle at import (``torch._C._cuda_getCurrentRawStream``,
    # bitsandbytes/backends/cuda/ops.py) to pass to its kernels; the mock's streams wait for nothing: the null stream.
    torch._C._cuda_getCurrentRawStream = _null_stream
    cuda_libraries.plain_for_optimizers(CudaTensor)
    attention.install(CudaTensor)
    tensor.PAYLOAD_KERNELS.update(flash_attention.PAYLOAD_KERNELS)
    # DeepSpeed wraps its engine's forward, backward and step in NVTX ranges (torch.cuda.nvtx.range_push);
    # a CPU build's NVTX stub raises "NVTX functions not installed": the mock's ranges mark nothing.
    torch.cuda.nvtx._nvtx = _Nvtx()
    # torch.distributed's logging and torch.profiler ask for NCCL's version when the backend is nccl.
    torch.cuda.nccl.version = lambda: NCCL_VERSION
    backend.register_process_group_backend(NCCL_STAND_IN)
    _patch_c10d("init_process_group", _routing_nccl)
    _patch_c10d("new_group", _routing_nccl)
    _patch_c10d("get_backend", _reporting_nccl)
    _report_dtensor_devices()
    nd_rules.install()
    foreach_sharding.install()
    mesh_concatenation.install()


def _patch_c10d(name: str, patch: Callable[[Callable], Callable]) -> None:
    """``torch.distributed``'s function ``name`` patched, where scripts call it and where torch's DeviceMesh does
    (it imported the function by name: ``init_device_mesh`` in a process without a group calls
    ``init_process_group()``, which on a GPU makes an nccl group)."""
    from torch.distributed import device_mesh

    patched = patch(getattr(dist, name))
    setattr(dist, name, patched)
    if hasattr(device_mesh, name):
        setattr(device_mesh, name, patched)


def _report_dtensor_devices() -> None:
    """A DTensor over mock GPU shards reports its shard's device, ``cuda:i``, as on a GPU: torch makes the
    DTensor with its local tensor's C++ device, PrivateUse1's (``cuda_sim:i``), which FSDP2 compares with its
    mesh's ``cuda`` device before it shards a tensor-parallel parameter again ("Expects DTensor to be moved
    to cuda"). Applied when torch's DTensor module is imported."""
    reported = torch._C.TensorBase.device

    def device(self: torch.Tensor) -> torch.device:
        local = self._local_tensor
        return local.device if type(local) is CudaTensor else reported.__get__(self)

    def patch(module: Any) -> None:
        module.DTensor.device = property(device)

    import_hooks.after_import("torch.distributed.tensor._api", patch)


#: Where each routed function takes ``backend`` positionally.
_BACKEND_POSITION = {"init_process_group": 0, "new_group": 2}


def _routing_nccl(function: Callable) -> Callable:
    """``function`` with a ``backend`` naming ``nccl`` sent to the gloo stand-in."""

    position = _BACKEND_POSITION[function.__name__]

    @functools.wraps(function)
    def routed(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position:
            args = (*args[:position], _stand_in(args[position]), *args[position + 1:])
        elif kwargs.get("backend") is not None:
            kwargs["backend"] = _stand_in(kwargs["backend"])
        elif function.__name__ == "init_process_group":  # no backend: torch's default for CUDA, nccl
            kwargs["backend"] = NCCL_STAND_IN
        if function.__name__ == "init_process_group" and _is_cuda(kwargs.get("device_id")):
            # ``device_id=torch.device("cuda", i)`` (DeepSpeed passes it) binds the group to a CUDA device for
            # NCCL's eager init and comm splitting; the stand-in is gloo, registered for the CPU and the
            # PrivateUse1 name, not for device type ``cuda`` ("No backend type associated with device type
            # cuda"): the group stays unbound, as on the CPU.
            kwargs.pop("device_id")
        return function(*args, **kwargs)

    return routed


def _is_cuda(device: Any) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"


def _stand_in(backend_name: Any) -> Any:
    if isinstance(backend_name, str) and NCCL_STAND_IN not in backend_name.lower():
        return backend_name.lower().replace("nccl", NCCL_STAND_IN)
    return backend_name


def _reporting_nccl(function: Callable) -> Callable:
    """``get_backend`` naming the stand-in ``nccl``, as the script asked for it."""

    @functools.wraps(function)
    def reported(*args: Any, **kwargs: Any) -> Any:
        return str(function(*args, **kwargs)).replace(NCCL_STAND_IN, "nccl")

    return reported
