"""Make torch treat a mock device family as one of its backends, from Python alone.

:func:`install` does, once per process (one family per process: torch has
one PrivateUse1 device):

- sets PrivateUse1 up as a Python backend called ``hidden_name`` (device
  guard, hooks, the ``torch.<name>`` device module), so that autograd, the
  optimizers and ``DistributedDataParallel`` accept the family's tensors;
- registers the factory kernels (``empty``, ``empty_strided``) for the
  PrivateUse1 dispatch key, and for the ``extra_keys`` (``XLA`` for the XLA
  family, whose device type is torch's own), so that ``torch.zeros(...,
  device="xla:0")``, ``Tensor.to("npu")`` and ``Module.to(device)`` create
  the family's `DeviceTensor` through torch's own code (without them a module
  move aborts the process in C++: "PyTorch is not linked with support for xla
  devices");
- registers ``_copy_from`` for PrivateUse1 (``torch.tensor(data, device=...)``
  copies below the Python dispatch key);
- installs torch's autocast rules for the family (:mod:`simulators.devices.kernels.autocast`);
- lets ``torch.load(..., map_location=<mock device>)`` keep the loaded
  storages on the host (a Python backend has no device storage): a tensor
  the mock saved comes back on its device, other tensors stay on the CPU,
  and ``Optimizer.load_state_dict`` moves its state to the parameters' device
  as it always does;
- sends ``variable.data = other`` across the CPU and the device to
  :func:`simulators.devices.families.tensor.swap_in` (FSDP moves and reshards so);
- in no-compute mode, makes the script's large CPU tensors lazy
  (:mod:`simulators.devices.no_compute.lazy_host`);
- tells the memory books of a storage resized in place (FSDP2 frees and
  re-allocates its unsharded parameters with ``UntypedStorage.resize_``);
- lets a library's ``Parameter`` subclass hold the family's tensors
  (:mod:`simulators.devices.families.parameter_subclasses`: bitsandbytes' quantized weights);
- makes ``Tensor.record_stream`` a no-op for the family's tensors (the mock's
  ops finish at once) and lets FSDP1's ``sync_module_states`` broadcast them
  whole (not their CPU payloads), so that torch's FSDP1 runs;
- runs ``scaled_dot_product_attention`` with the kernel the CPU would pick
  (torch's C++ side gives a Python backend only the math kernel);

:func:`register_process_group_backend` adds a torch.distributed backend name
(``"xla"``, ``"hccl"``) for the CPU and the device, served by gloo: the
collectives of a `DeviceTensor` run on its CPU payload.

Catalog: xla.distributed_type, npu.distributed_type.
"""
from __future__ import annotations

import atexit
import sys
from datetime import timedelta
from types import ModuleType
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from simulators.devices.kernels import autocast
from simulators.devices.no_compute import lazy_host, meta_payloads
from simulators.devices.families import loading, parameter_subclasses
from simulators.devices.memory import peaks
from simulators.devices.families.import_hooks import after_import
from simulators.devices.families.tensor import (DEVICE_KERNELS, PAYLOAD_ADAPTERS, DeviceTensor, add_function_rule, swap_tensors,
                                      swapping_data)

_installed: list[type[DeviceTensor]] = []
# Kernels stay registered as long as their Library object lives.
_libraries: list[torch.library.Library] = []


def installed() -> type[DeviceTensor] | None:
    """The family installed in this process (its tensor class), if any."""
    return _installed[0] if _installed else None


def install(
    tensor_class: type[DeviceTensor],
    hidden_name: str,
    device_module: Any,
    extra_keys: Sequence[str] = (),
    autocast_aliases: tuple[str, ...] = (),
) -> None:
    """Install ``tensor_class``'s family (see the module docstring); a no-op if it is installed.

    ``extra_keys`` get the factory kernels too; ``torch.autocast`` on ``autocast_aliases`` covers the family.

    Raises RuntimeError if another family already took PrivateUse1 in this process.
    """
    if _installed:
        if _installed[0] is not tensor_class:
            raise RuntimeError(
                f"simulators: the {_installed[0].device_type} mock device is installed in this process; "
                f"a process has one mock device family, so {tensor_class.device_type} cannot be added"
            )
        return
    _setup_privateuseone_for_python_backend(rename=hidden_name, backend_module=device_module)
    _register_kernels(tensor_class, ("PrivateUse1", *extra_keys))
    autocast.install(autocast_aliases)
    loading.install(tensor_class.device_type, hidden_name)
    add_function_rule(swapping_data)
    lazy_host.install(tensor_class)
    torch.utils.swap_tensors = swap_tensors  # Module._apply calls it through the module
    torch.Tensor.record_stream = _recording_on_mock_streams(torch.Tensor.record_stream)
    torch.Tensor._make_wrapper_subclass = _on_the_hidden_device(torch.Tensor._make_wrapper_subclass,
                                                                tensor_class.device_type, hidden_name)
    parameter_subclasses.install()
    torch.UntypedStorage.resize_ = _counting_resizes(torch.UntypedStorage.resize_, tensor_class.memory)
    after_import("torch.distributed.fsdp._init_utils", _sync_mock_tensors_whole)
    _installed.append(tensor_class)


def apply_launch_environment() -> None:
    """Do for the installed family what this process's launch environment asks: record its memory peaks and write
    their reports where the launch asked for them (:func:`simulators.devices.memory.peaks.install`).

    Run after :func:`install` by the family's ``torch.backends`` entry point, which torch calls after importing its
    module (torch/__init__.py, ``_import_device_backends``), so that a process forked from one that imported the
    module calls it again under its own environment (:mod:`simulators._fork_root`); :func:`install` reads none.
    """
    peaks.install(installed().memory)


def register_process_group_backend(name: str) -> None:
    """Let ``torch.distributed.init_process_group(backend=name)`` make a gloo group for the installed device.

    ``all_gather_into_tensor`` takes any output of the right size (a flat one,
    as HF accelerate passes on accelerators), as nccl and hccl do; gloo wants
    the input's shape stacked, so the output is viewed that way for it. DDP's check of
    the parameters across ranks works on meta payloads (:mod:`simulators.devices.no_compute.meta_payloads`). A functional
    collective's result is wrapped in an ``AsyncCollectiveTensor`` holding the device tensor, as its CUDA kernel
    does (run on the payload, it would hold host memory under a device tensor: ``untyped_storage().data_ptr()``,
    which safetensors asks when ``save_pretrained`` saves a gathered DTensor, would then fail).
    """
    if name in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(name, _gloo, devices=["cpu", torch._C._get_privateuse1_backend_name()])
    PAYLOAD_ADAPTERS[torch.ops.c10d._allgather_base_.default] = _stacked_output
    after_import("torch.distributed._functional_collectives", _wrap_on_the_device)
    dist._verify_params_across_processes = meta_payloads.verifying_params(dist._verify_params_across_processes)


def _wrap_on_the_device(functional_collectives: ModuleType) -> None:
    """``_wrap_tensor_autograd`` (torch 2.12 on; before, Python wraps the result itself) as its kernel runs it."""
    if hasattr(torch.ops._c10d_functional, "_wrap_tensor_autograd"):
        DEVICE_KERNELS[torch.ops._c10d_functional._wrap_tensor_autograd.default] = functional_collectives.AsyncCollectiveTensor


def _on_the_hidden_device(make: Callable[..., torch.Tensor], device_type: str, hidden_name: str) -> Any:
    """``Tensor._make_wrapper_subclass`` making a wrapper around a mock tensor on the device torch's C++ side knows,
    as the mock tensors are made (PrivateUse1's index 0). A wrapper subclass (``AsyncCollectiveTensor``, a quantized
    tensor) takes its device from the tensor it wraps, whose ``device`` reports the family's name (``cuda:1``), which
    a CPU build of torch cannot make tensors on."""

    def made(cls: type, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if device is not None and torch.device(device).type == device_type:
            device = torch.device(hidden_name, 0)
        return make(cls, *args, device=device, **kwargs)

    return staticmethod(made)


def _stacked_output(args: tuple) -> tuple:
    """``_allgather_base_`` arguments with the output viewed as the inputs stacked along dim 0."""
    output, source, *rest = args
    rows = source.reshape(1) if source.dim() == 0 else source
    return (output.view(-1, *rows.shape[1:]), rows, *rest)


def _register_kernels(tensor_class: type[DeviceTensor], keys: Sequence[str]) -> None:
    library = torch.library.Library("aten", "IMPL")

    def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        if dtype == torch.int32 and (_made_by_ddp_reducer() or meta_payloads.enabled() and _ddp_rebuilding_buckets()):
            return torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format)
        payload = torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format,
                              device=meta_payloads.payload_device_for(size, dtype))
        return tensor_class.wrap(payload, tensor_class.index_of(device))

    def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
        payload = torch.empty_strided(size, stride, dtype=dtype, layout=layout, device=meta_payloads.payload_device_for(size, dtype))
        return tensor_class.wrap(payload, tensor_class.index_of(device))

    def copy_from(source, destination, non_blocking=False):
        target, payload = _payload(destination), _payload(source)
        if payload.is_meta and not target.is_meta:  # no-compute mode: a copy to the host (or a kept value) gets zeros
            if not isinstance(destination, DeviceTensor):
                meta_payloads.record("cpu copy")
            target.zero_()
        else:
            target.copy_(payload)
        return destination

    for key in keys:
        library.impl("empty.memory_format", empty, key)
        library.impl("empty_strided", empty_strided, key)
    library.impl("_copy_from", copy_from, "PrivateUse1")
    library.impl("scaled_dot_product_attention", _attention_as_on_cpu, "AutogradPrivateUse1")
    _libraries.append(library)


def _attention_as_on_cpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` with the kernel the CPU would pick for the payloads (values as on CPU).

    torch's C++ ``scaled_dot_product_attention`` asks a device's ``_fused_sdp_choice`` stub, which a
    Python backend cannot register, and falls back to the math kernel: the CPU picks its flash kernel
    for most inputs, whose results differ from the math kernel's in the last bits. Here the CPU's choice
    is asked of the payloads, and its kernel runs (as ``attention.cpp`` does for the CPU: a boolean mask
    becomes 0 / -inf first); both are differentiable aten ops, so autograd records them as usual."""
    choice = torch._fused_sdp_choice(
        _on_host(query), _on_host(key), _on_host(value), attn_mask=None if attn_mask is None else _on_host(attn_mask),
        dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
    )
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), torch.zeros((), dtype=query.dtype, device=attn_mask.device))
    if choice == 1:  # sdp::SDPBackend::flash_attention
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s payload, or in no-compute mode (a meta payload, for which torch picks no kernel) an empty CPU
    tensor of its sizes, strides and dtype: the CPU's kernel choice reads nothing else."""
    payload = _payload(tensor)
    return torch.empty_strided(payload.shape, payload.stride(), dtype=payload.dtype) if payload.is_meta else payload


def _counting_resizes(resize: Any, memory: Any) -> Any:
    """``UntypedStorage.resize_`` that tells the books first (see ``DeviceMemory.storage_resizing``)."""

    def resized(storage: torch.UntypedStorage, size: int) -> Any:
        memory.storage_resizing(storage, int(size))
        return resize(storage, size)

    return resized


def _recording_on_mock_streams(record_stream: Any) -> Any:
    """``Tensor.record_stream``, a no-op for a mock tensor: the mock's ops finish at once, so no stream's pending
    work keeps its memory (torch's would refuse the mock's stream objects; FSDP1 records its gradients so)."""

    def recorded(tensor: torch.Tensor, stream: Any) -> None:
        if isinstance(tensor, DeviceTensor):
            return None
        return record_stream(tensor, stream)

    return recorded


def _sync_mock_tensors_whole(init_utils: ModuleType) -> None:
    """FSDP1's ``sync_module_states`` broadcasts a mock tensor itself, as a GPU's tensor.

    torch flattens a traceable wrapper subclass into its inner tensors there (for DTensor-like
    parameters), and a mock tensor's inner tensor is its CPU payload, which FSDP1 then refuses as
    "CPU parameters or buffers"; the mock's collectives take mock tensors as they are."""
    flattened = init_utils.is_traceable_wrapper_subclass
    init_utils.is_traceable_wrapper_subclass = lambda tensor: not isinstance(tensor, DeviceTensor) and flattened(tensor)


def _ddp_rebuilding_buckets() -> bool:
    """Whether DDP's Reducer is rebuilding its buckets (before the second forward), which broadcasts rank 0's
    bucket indices and reads them back: in no-compute mode they stay in host memory so that gloo moves them
    (a meta payload would read back as zeros: no buckets)."""
    return _in_ddp("_pre_forward") or _in_ddp("main_hook")  # the second: a join's shadow forward


def _in_ddp(function: str) -> bool:
    """Whether DDP's ``function`` (in ``torch/nn/parallel``) is on this thread's stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function and "torch/nn/parallel" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _made_by_ddp_reducer() -> bool:
    """Whether DDP's Reducer is being built (it asks for its map of used parameters then).

    The Reducer keeps that map on the parameters' device and, on an
    accelerator, stages it through pinned host memory, which a Python-only
    PrivateUse1 backend cannot allocate (torch gives it no hook for that), so
    ``find_unused_parameters=True`` and ``static_graph=True`` would fail in
    backward. On the mock devices the map stays in host memory instead; gloo
    reduces it there, as it would on CPU.
    """
    return _in_ddp("_ddp_init_helper")


def _payload(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._payload if isinstance(tensor, DeviceTensor) else tensor


#: The gloo groups this process made for the device's backend name, each kept until the process starts a new world
#: (makes a default group again) or exits. torch 2.13 stashes a ``contextvars`` context in the thread-local state of
#: every backward (torch/autograd/graph.py, ``_engine_run_backward``), which the gloo works the backward launches
#: capture; the group's worker thread, dropping the last such work, takes the GIL to release it. Where a C++ owner
#: freed with the GIL held (DDP's Reducer, when a function that made the model returns after destroying the group)
#: held the group last, the group's destructor joined that worker, which waited for that GIL: the rank hung
#: (pytorch/pytorch#182083 is the same stash's deadlock at a thread's exit). Released from this list instead, the
#: group's destructor runs with the GIL released (torch binds ProcessGroupGloo with a no-GIL destructor).
_groups: list[dist.ProcessGroupGloo] = []
atexit.register(_groups.clear)


def _gloo(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroupGloo:
    if not dist.is_initialized():  # a new world: the last one's groups were destroyed
        _groups.clear()
    _groups.append(dist.ProcessGroupGloo(store, rank, size, timeout))
    return _groups[-1]
