"""``write_basic_config`` and ``accelerate-ref config default`` (catalog ``config.write_basic_config``)."""

from __future__ import annotations

import os

import torch

from .config_args import ClusterConfig, default_config_file

PRECISIONS = ("no", "fp16", "bf16", "fp8")


def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> str | bool:
    """Write a one-machine config for the accelerators found here (all CUDA devices, else the CPU).

    Refuses to overwrite: when ``save_location`` exists it says so and returns False. Otherwise it
    returns the path written. ``mixed_precision`` must be one of ``no``, ``fp16``, ``bf16``, ``fp8``.
    """
    path = save_location if save_location is not None else default_config_file()
    if os.path.exists(path):
        print(f"Configuration already exists at {path}, will not override. Pass a different `save_location`.")
        return False
    mixed_precision = str(mixed_precision).lower()
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"`mixed_precision` should be one of {', '.join(PRECISIONS)}; received {mixed_precision!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    config = ClusterConfig(
        mixed_precision=mixed_precision,
        num_processes=max(gpus, 1),
        use_cpu=gpus == 0,
        distributed_type="MULTI_GPU" if gpus > 1 else "NO",
        rdzv_backend=None,
        same_network=None,
    )
    config.to_yaml_file(path)
    return path
