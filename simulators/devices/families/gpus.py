"""The GPUs a dry run can simulate (``--gpu``): each card's memory as torch reports it, its architecture, and what
the GPU's runtime holds beside torch's caching allocator.

Rules:

- **The card's memory** is ``torch.cuda.get_device_properties(i).total_memory`` (CUDA's ``totalGlobalMem``, the
  figure ``deviceQuery`` prints too), not the size the card is sold with: an H100 80GB reports 81,105 MiB, an
  H200 143,156 MiB. Each preset names where its figure was read. The same card reports a little more or less with
  another driver (a few hundred MiB at most in the sources below).
- **Beside the allocator**, in every process that uses the GPU (``runtime_held``):
  - the CUDA context, 426 MiB: measured as nvidia-smi's usage of a process whose only CUDA call was
    ``torch.cuda.mem_get_info`` (torch 2.10, CUDA 13, lazy module loading; unslothai/unsloth-zoo PR 1053). PyTorch's
    maintainers give "around 400MB if CUDA >= 11.7 is used and lazy module loading enabled"
    (pytorch/pytorch#109888);
  - NCCL's buffers for the world's process group, where it has more than one rank: 544 MiB for a group of two,
    688 MiB for a larger one, as measured after an all-reduce on 4 A100s with NVLink (NVIDIA/nccl#964). NCCL's
    memory grows with its channels and peers (NVIDIA/nccl#864), and every further communicator (a sub-group of
    an N-D mesh, HSDP's replicate group) holds its own, which this figure leaves out.
- **Architecture**: the compute capability picks the libraries' rules (:mod:`simulators.devices.memory.cuda_libraries`:
  cuBLAS's 32 MiB workspace on capabilities 9 to 12, torch's ``parseChosenWorkspaceSize``) and the
  multiprocessors the reduction kernels split over (:mod:`simulators.devices.memory.cuda_reduce`). ``calibrated``
  says whether a dry run on the card's architecture has been compared with a real one (``benchmarks/gpu/``,
  ``../shared/gpu/``: an H200); the summary says so where it has not.
"""
from __future__ import annotations

from typing import NamedTuple

MIB = 1 << 20


class GpuPreset(NamedTuple):
    """One ``--gpu`` preset (see the module docstring)."""

    #: ``total_memory`` as torch reports it, in bytes.
    memory: int
    #: Where ``memory`` was read.
    source: str
    capability: tuple[int, int]
    multiprocessors: int
    #: Whether dry runs on this architecture were compared with a real card of it.
    calibrated: bool = False


_DEVICE_QUERY = "deviceQuery's totalGlobalMem"
_TORCH = "torch.cuda.get_device_properties' total_memory"
#: Common GPUs, by name (``--gpu``).
GPU_PRESETS = {
    "t4-16gb": GpuPreset(15_843_721_216, f"{_DEVICE_QUERY}, chiemon.github.io/2024/12/25", (7, 5), 40),
    "v100-32gb": GpuPreset(32_510 * MIB, f"{_TORCH} of a V100-PCIE-32GB (the SXM2 card has the same HBM2)", (7, 0), 80),
    "a10g-24gb": GpuPreset(22_587 * MIB, f"{_TORCH}, torch 2.15 with CUDA 13", (8, 6), 80),
    "l4-24gb": GpuPreset(23_570_219_008, f"{_DEVICE_QUERY}, github.com/thamada/nvidia-smi gls/L4_deviceQuery.py", (8, 9), 58),
    "rtx4090-24gb": GpuPreset(25_386_352_640, f"{_DEVICE_QUERY}, github.com/thamada/nvidia-smi gls/RTX4090_deviceQuery.py",
                              (8, 9), 128),
    "l40s-48gb": GpuPreset(47_803_596_800, f"{_DEVICE_QUERY}, github.com/thamada/nvidia-smi gls/L40S_deviceQuery.py",
                           (8, 9), 142),
    "rtx5090-32gb": GpuPreset(33_677_180_928, f"{_DEVICE_QUERY}, github.com/aikitoria/open-gpu-kernel-modules issue 1",
                              (12, 0), 170),
    "a100-40gb": GpuPreset(42_298_834_944, f"{_DEVICE_QUERY}, github.com/bottlerocket-os/bottlerocket pull 3873", (8, 0), 108),
    "a100-80gb": GpuPreset(85_100_068_864, f"{_DEVICE_QUERY}, github.com/thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py",
                           (8, 0), 108),
    "h100-80gb": GpuPreset(85_045_477_376, f"{_DEVICE_QUERY}, github.com/thamada/nvidia-smi gls/H100SXMx8_deviceQuery.py",
                           (9, 0), 132, calibrated=True),
    "h100-pcie-80gb": GpuPreset(81_008 * MIB, f"{_TORCH}, torch 2.0.1", (9, 0), 114, calibrated=True),
    "h200-141gb": GpuPreset(143_156 * MIB, f"{_TORCH}, github.com/ai-bot-pro/achatbot deploy/modal (vLLM image, CUDA 12.6)",
                            (9, 0), 132, calibrated=True),
    "b200-180gb": GpuPreset(182_642 * MIB, f"{_TORCH}, github.com/ai-bot-pro/achatbot deploy/modal (vLLM image, CUDA 12.6)",
                            (10, 0), 148),
}
#: The GPU a dry run simulates when no ``--gpu`` names one: the most common data-centre GPU's architecture.
DEFAULT_GPU = "h100-80gb"

#: The CUDA context of a process (see the module docstring).
CUDA_CONTEXT = 426 * MIB
#: NCCL's buffers for a process group of two ranks, and of more (see the module docstring).
NCCL_PAIR_BUFFERS, NCCL_GROUP_BUFFERS = 544 * MIB, 688 * MIB


def preset(name: str) -> GpuPreset:
    """GPU preset ``name`` (any case); ValueError naming the presets for an unknown one."""
    try:
        return GPU_PRESETS[name.lower()]
    except KeyError:
        raise ValueError(f"--gpu: unknown GPU {name!r}; known: {', '.join(GPU_PRESETS)}") from None


def runtime_held(world_size: int) -> dict[str, int]:
    """What the GPU's runtime holds beside torch's allocator in each of ``world_size`` processes, by what it is."""
    held = {"CUDA context": CUDA_CONTEXT}
    if world_size > 1:
        held["NCCL buffers"] = NCCL_PAIR_BUFFERS if world_size == 2 else NCCL_GROUP_BUFFERS
    return held


__all__ = ["GpuPreset", "GPU_PRESETS", "DEFAULT_GPU", "CUDA_CONTEXT", "NCCL_PAIR_BUFFERS", "NCCL_GROUP_BUFFERS", "preset",
           "runtime_held"]
