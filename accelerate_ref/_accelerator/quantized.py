"""bitsandbytes 8-bit and 4-bit models with an ``hf_device_map`` at `Accelerator.prepare` (HF 1.15's rules).

Catalog: prepare.verify_device_map.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..utils.dataclasses import DistributedType


def check_placement(model: torch.nn.Module, device: torch.device, distributed_type: DistributedType, *,
                    multi_backend: Callable[[], bool], xpu: Callable[[], bool]) -> bool:
    """Refuse a bitsandbytes 8-bit or 4-bit model whose ``hf_device_map`` it cannot train on; True when
    ``model`` is such a model with a map (it is then never moved), False otherwise.

    Rules (HF 1.15), each a ValueError: a map over several devices under any
    distributed type but NO; a map on one device that is not this process's
    (an index that differs, unless the Accelerator's device has no index and
    the map's is 0; a CPU Accelerator with bitsandbytes' multi-backend takes
    any); a map with "disk", or with "cpu" unless bitsandbytes has its
    multi-backend and no XPU is available.
    """
    if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
        return False
    if not getattr(model, "hf_device_map", False):
        return False
    devices = set(model.hf_device_map.values())
    if len(devices) > 1 and distributed_type != DistributedType.NO:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple devices in any "
            "distributed mode. In order to use 8-bit or 4-bit models that have been loaded across multiple GPUs the "
            "solution is to use Naive Pipeline Parallelism. Therefore you should not specify that you are under any "
            "distributed regime in your accelerate config."
        )
    if len(devices) == 1:
        (mapped,) = devices
        index = mapped.index if isinstance(mapped, torch.device) else torch.device(mapped).index if isinstance(mapped, str) else mapped
        index = None if index is None else int(index)
        cpu_multi_backend = device.type == "cpu" and multi_backend()
        if (not cpu_multi_backend and torch.device(device.type, index) != device
                and (device.index is not None or index != 0)):
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision on a different device "
                "than the one you're training on. Make sure you loaded the model on the correct device using for "
                "example `device_map={'':torch.cuda.current_device()}` or "
                "`device_map={'':torch.xpu.current_device()}`"
            )
    cpu_refused = "cpu" in devices and (not multi_backend() or xpu())
    if cpu_refused or "disk" in devices:
        raise ValueError(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk offload. "
            "If you want train the 8-bit or 4-bit model in CPU, please install bitsandbytes with multi-backend, see "
            "https://huggingface.co/docs/bitsandbytes/main/en/installation#multi-backend"
        )
    return True
