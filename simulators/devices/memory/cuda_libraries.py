"""What the CUDA libraries take from torch's allocator that a CPU run never allocates, counted on the mock GPU.

Found in the caching allocator's snapshots of a real H200 (``../shared/gpu/*.pickle``, made by
``../shared/gpu/capture.py``; each allocation there carries its C++ stack) and in torch's
``aten/src/ATen/cuda/CublasHandlePool.cpp``, whose rules they follow:

- **cuBLAS workspace**: the first cuBLAS call of a thread (``getCurrentCUDABlasHandle`` ->
  ``setWorkspaceForHandle``) allocates a workspace for its (handle, stream) from torch's allocator and
  keeps it for the life of the process. Handles are per thread, so the main thread and autograd's
  backward thread for the device each hold one (snapshot ``mlp.pickle``: one 33,554,432-byte allocation
  in ``setWorkspaceForHandle`` under ``Engine::thread_main``, beside the main thread's, made before
  recording). Its size is ``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs, SIZE KiB each) or, unset,
  32 MiB on a GPU of compute capability 9 to 12 (Hopper and Blackwell) and 4096 KiB x 2 + 16 KiB x 8
  elsewhere (``parseChosenWorkspaceSize``, torch 2.13);
- **cuBLASLt workspace**: a matrix product with a bias vector (``addmm`` with a 1-D bias: ``nn.Linear``'s
  forward) runs through cuBLASLt, whose first call per thread allocates ``CUBLASLT_WORKSPACE_SIZE`` KiB
  (default 1024) and keeps it (``getCUDABlasLtWorkspace``; snapshot ``mlp.pickle``: 1,048,576 bytes in the
  first forward ``addmm``);
- **foreach optimizers**: torch's optimizers default to their multi-tensor (``foreach``) kernels when
  every parameter is a plain tensor on CUDA (``torch.optim.optimizer._default_to_fused_or_foreach``), which
  allocate otherwise than the per-parameter loop (AdamW: one ``_foreach_sqrt`` result per parameter,
  where the loop holds ``sqrt`` and ``div`` results at once: ``embedding.pickle``'s step). The mock's
  parameters are a tensor subclass, which torch would send down the loop: they count as plain tensors.

The GPU's architecture is :func:`simulators.devices.families.machine.gpu_capability` (``--gpu`` sets it).
"""
from __future__ import annotations

import os
import re
import threading
from typing import Any

import torch

from simulators.devices.families import machine
from simulators.devices.memory import peaks

#: The ops that call cuBLAS (a handle, so a workspace, for the calling thread).
CUBLAS_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "addr", "dot", "vdot", "_addmm_activation",
})
#: The ops that take the cuBLASLt path (with a bias vector).
CUBLASLT_OPS = frozenset({"addmm", "_addmm_activation"})
#: The ops that run cuDNN's convolutions, whose engines and workspaces the GPU picks: the dry run's figures are then
#: a lower bound (``simulators.dryrun.LOWER_BOUNDS``).
CUDNN_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution", "convolution_backward"})
#: ``parseChosenWorkspaceSize``'s defaults: Hopper's, and every other architecture's.
HOPPER_WORKSPACE = 4096 * 8 * 1024
#: The compute capabilities (major) that take Hopper's workspace: Hopper and Blackwell (9, 10, 11, 12).
LARGE_WORKSPACE_MAJORS = frozenset({9, 10, 11, 12})
DEFAULT_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
#: ``parseCUDABlasLtWorkspaceSize``'s default, in KiB.
DEFAULT_LT_WORKSPACE_KIB = 1024

#: Per (library, thread, device index): the meta payload the books count as that workspace.
_workspaces: dict[tuple[str, int, int], torch.Tensor] = {}
_lock = threading.Lock()


def cublas_workspace_size() -> int:
    """Bytes of one cuBLAS workspace: ``CUBLAS_WORKSPACE_CONFIG`` (``:4096:8`` = 4096 KiB x 8), else the default
    of the simulated GPU's architecture."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return HOPPER_WORKSPACE if machine.gpu_capability()[0] in LARGE_WORKSPACE_MAJORS else DEFAULT_WORKSPACE


def cublaslt_workspace_size() -> int:
    """Bytes of one cuBLASLt workspace (``CUBLASLT_WORKSPACE_SIZE`` KiB), at most the cuBLAS workspace's."""
    try:
        kib = int(os.environ.get("CUBLASLT_WORKSPACE_SIZE", DEFAULT_LT_WORKSPACE_KIB))
    except ValueError:
        kib = DEFAULT_LT_WORKSPACE_KIB
    return min(kib * 1024, cublas_workspace_size())


def observe(tensor_class: type, func: Any, tensors: list) -> None:
    """Before ``func`` runs on mock GPU ``tensors``: the workspaces its library takes on first use in this thread."""
    name = func._opname
    if name in CUDNN_OPS:
        peaks.RECORDER.lower_bounds.add("cudnn")
    if name not in CUBLAS_OPS:
        return
    index = tensors[0].device_index
    _hold(tensor_class, "cublas", index, cublas_workspace_size)
    if name in CUBLASLT_OPS and tensors[0].dim() == 1:
        _hold(tensor_class, "cublaslt", index, cublaslt_workspace_size)


def _hold(tensor_class: type, library: str, index: int, size_of: Any) -> None:
    key = (library, threading.get_ident(), index)
    if key in _workspaces:
        return
    with _lock:
        if key not in _workspaces:
            workspace = torch.empty(size_of(), dtype=torch.uint8, device="meta")
            tensor_class.memory.track(workspace, index)
            _workspaces[key] = workspace


def plain_for_optimizers(tensor_class: type) -> None:
    """Let torch's optimizers take their foreach kernels for ``tensor_class``'s parameters, as for CUDA's."""
    from torch.optim import optimizer

    if tensor_class not in optimizer._foreach_supported_types:
        optimizer._foreach_supported_types.append(tensor_class)


__all__ = ["CUBLAS_OPS", "CUBLASLT_OPS", "cublas_workspace_size", "cublaslt_workspace_size", "observe",
           "plain_for_optimizers"]
