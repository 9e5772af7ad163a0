"""``write_basic_config`` and ``accelerate-ref config default`` (catalog ``config.write_basic_config``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ...utils.imports import (
    is_hpu_available,
    is_mlu_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_sdaa_available,
    is_xpu_available,
)
from .config_args import ClusterConfig, current_default_config_file, default_json_config_file
from .config_utils import SubcommandHelpFormatter

PRECISIONS = ("no", "fp16", "bf16", "fp8")

description = "Create a default config file for Accelerate with only a few flags set."


#: The accelerators ``write_basic_config`` looks for, in HF 1.15's order: (torch module, availability, distributed type).
_ACCELERATORS = (
    ("mlu", is_mlu_available, "MULTI_MLU"),
    ("sdaa", is_sdaa_available, "MULTI_SDAA"),
    ("musa", is_musa_available, "MULTI_MUSA"),
    ("hpu", is_hpu_available, "MULTI_HPU"),
    ("cuda", lambda: torch.cuda.is_available(), "MULTI_GPU"),
    ("xpu", is_xpu_available, "MULTI_XPU"),
    ("npu", is_npu_available, "MULTI_NPU"),
    ("neuron", is_neuron_available, "MULTI_NEURON"),
)


def _devices() -> dict:
    """``num_processes``, ``use_cpu`` and ``distributed_type`` for every device of the first accelerator found, else the CPU."""
    for module, available, multi in _ACCELERATORS:
        if available():
            count = getattr(torch, module).device_count()
            return {"num_processes": count, "use_cpu": False, "distributed_type": multi if count > 1 else "NO"}
    return {"use_cpu": True, "num_processes": 1, "distributed_type": "NO"}


def write_basic_config(mixed_precision="no", save_location: str = default_json_config_file):
    """Write a one-machine config for the accelerators found here (every device of the first kind found, else the CPU).

    Rules (HF 1.15's): refuses to overwrite: when ``save_location`` exists it prints
    ``Configuration already exists at <save_location>, will not override. ...`` and returns False
    (its folder is created first, either way). ``mixed_precision`` (any case) must be one of ``no``,
    ``fp16``, ``bf16``, ``fp8``, else a ValueError. The config is written as JSON whatever the file's
    suffix (JSON is YAML too, so the launcher reads it back either way) and the `pathlib.Path`
    written is returned. The default ``save_location`` is fixed when the module is imported, as in
    🤗 Accelerate (``config default`` applies the location rule when it runs).
    Catalog: config.write_basic_config.
    """
    path = Path(save_location)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        print(
            f"Configuration already exists at {save_location}, will not override. Run `accelerate config` manually "
            "or pass a different `save_location`."
        )
        return False
    mixed_precision = mixed_precision.lower()
    if mixed_precision not in PRECISIONS:
        raise ValueError(
            f"`mixed_precision` should be one of 'no', 'fp16', 'bf16', or 'fp8'. Received {mixed_precision}"
        )
    config = ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        mixed_precision=mixed_precision,
        **_devices(),
        debug=False,
        enable_cpu_affinity=False,
    )
    config.to_json_file(path)
    return path


def default_config_command(args: argparse.Namespace) -> None:
    """``config default``: ``write_basic_config`` at ``--config_file`` (default: the location rule, applied now)."""
    save_location = args.save_location if args.save_location is not None else current_default_config_file()
    written = write_basic_config(args.mixed_precision, save_location)
    if written:
        print(f"accelerate configuration saved at {written}")


def default_command_parser(parser, parents):
    """Add ``default`` to the ``config`` subcommands ``parser``."""
    parser = parser.add_parser("default", parents=parents, help=description, formatter_class=SubcommandHelpFormatter)
    parser.add_argument("--config_file", "--config-file", default=None, dest="save_location",
                        help="where to write (default: default_config.yaml under $HF_HOME/accelerate)")
    parser.add_argument("--mixed_precision", "--mixed-precision", default="no", choices=PRECISIONS)
    parser.set_defaults(func=default_config_command)
    return parser
