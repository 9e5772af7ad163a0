"""``write_basic_config`` and ``accelerate-ref config default`` (catalog ``config.write_basic_config``)."""

from __future__ import annotations

import argparse
import os

import torch

from .config_args import ClusterConfig, current_default_config_file, default_json_config_file
from .config_utils import SubcommandHelpFormatter

PRECISIONS = ("no", "fp16", "bf16", "fp8")

description = "Create a default config file for Accelerate with only a few flags set."


def write_basic_config(mixed_precision="no", save_location: str = default_json_config_file):
    """Write a one-machine config for the accelerators found here (all CUDA devices, else the CPU).

    Refuses to overwrite: when ``save_location`` exists it says so and returns False. Otherwise it
    creates the folder and returns the path written. ``mixed_precision`` must be one of ``no``,
    ``fp16``, ``bf16``, ``fp8``. The default ``save_location`` is fixed when the module is imported,
    as in 🤗 Accelerate (``config default`` applies the location rule when it runs).
    """
    path = os.fspath(save_location)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path):
        print(f"Configuration already exists at {path}, will not override. Pass a different `save_location`.")
        return False
    mixed_precision = str(mixed_precision).lower()
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"`mixed_precision` should be one of {', '.join(PRECISIONS)}; received {mixed_precision!r}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    config = ClusterConfig(
        compute_environment="LOCAL_MACHINE",
        distributed_type="MULTI_GPU" if gpus > 1 else "NO",
        mixed_precision=mixed_precision,
        use_cpu=gpus == 0,
        debug=False,
        num_processes=max(gpus, 1),
        enable_cpu_affinity=False,
    )
    config.to_yaml_file(path)
    return path


def default_config_command(args: argparse.Namespace) -> None:
    """``config default``: ``write_basic_config`` at ``--config_file`` (default: the location rule, applied now)."""
    save_location = args.save_location if args.save_location is not None else current_default_config_file()
    written = write_basic_config(args.mixed_precision, save_location)
    if written:
        print(f"accelerate-ref configuration saved at {written}")


def default_command_parser(parser, parents):
    """Add ``default`` to the ``config`` subcommands ``parser``."""
    parser = parser.add_parser("default", parents=parents, help=description, formatter_class=SubcommandHelpFormatter)
    parser.add_argument("--config_file", "--config-file", default=None, dest="save_location",
                        help="where to write (default: default_config.yaml under $HF_HOME/accelerate)")
    parser.add_argument("--mixed_precision", "--mixed-precision", default="no", choices=PRECISIONS)
    parser.set_defaults(func=default_config_command)
    return parser
