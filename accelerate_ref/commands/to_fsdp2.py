"""``accelerate-ref to-fsdp2``: rewrite a launch config's FSDP1 ``fsdp_config`` for FSDP2 (a pure key/value conversion).

Keys FSDP2 keeps are copied, renamed ones renamed (``fsdp_sharding_strategy`` becomes
``fsdp_reshard_after_forward``, its value True for the strategies that reshard), keys
FSDP2 dropped or does not implement yet are left out with a warning, unknown keys are
kept; ``fsdp_version`` becomes 2. A config already at version 2, or without an
``fsdp_config``, is returned unchanged. As in 🤗 Accelerate 1.15.
"""

from __future__ import annotations

import enum
import logging
from pathlib import Path

import yaml

from .utils import CustomArgumentParser


class ConversionStatus(enum.Enum):
    """What happens to an FSDP1 key that FSDP2 has no counterpart for."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


#: FSDP1 key -> its FSDP2 key, or why it is dropped.
ARGUMENT_KEY_MAPPING = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}

_RESHARDS = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False}
#: FSDP1 key -> how its values convert (a sharding strategy becomes "reshard after forward").
ARGUMENT_VALUE_MAPPING = {"fsdp_sharding_strategy": dict(_RESHARDS), "fsdp_reshard_after_forward": dict(_RESHARDS)}

logger = logging.getLogger(__name__)


def convert_config_to_fsdp2(config: dict) -> dict:
    """``config`` with its ``fsdp_config`` converted to FSDP2 (in place, and returned)."""
    fsdp_config = config.get("fsdp_config", {})
    if not fsdp_config:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if fsdp_config.get("fsdp_version", 1) == 2:
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        logger.warning("If the config doesn't use new argument names, change `fsdp_version` to `1` and rerun the command.")
        return config
    converted = {}
    for key, value in fsdp_config.items():
        target = ARGUMENT_KEY_MAPPING.get(key)
        if target is None:
            converted[key] = value
        elif isinstance(target, ConversionStatus):
            reason = "has been removed" if target is ConversionStatus.REMOVED else "is not yet implemented"
            logger.warning(f"Argument {key} {reason} in FSDP2, skipping this key...")
        else:
            converted[target] = ARGUMENT_VALUE_MAPPING.get(key, {}).get(value, value)
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def load_config(config_file: str) -> dict:
    """The YAML mapping in ``config_file``; an empty file is a ValueError."""
    with open(config_file) as handle:
        config = yaml.safe_load(handle)
    if not config:
        raise ValueError("Config file is empty")
    return config


def _validate_to_fsdp2_args(args) -> None:
    """Refuse, in 🤗 Accelerate's order and words: a ``--config_file`` that does not exist (FileNotFoundError), no
    ``--output_file`` without ``--overwrite`` (ValueError), an ``--output_file`` that exists without ``--overwrite``
    (FileExistsError). Existence is asked of ``pathlib.Path.exists``, as 🤗 Accelerate asks it (its tests patch it)."""
    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file} not found")
    if not args.overwrite and args.output_file is None:
        raise ValueError("If --overwrite is not set, --output_file must be provided")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(f"Output file {args.output_file} already exists and --overwrite is not set")


def to_fsdp2_command(args):
    """Convert ``args.config_file`` into ``args.output_file`` (or over itself with ``--overwrite``); the file is
    read and written only once ``_validate_to_fsdp2_args`` accepted the arguments."""
    _validate_to_fsdp2_args(args)
    config = load_config(args.config_file)
    if args.overwrite and args.output_file is None:
        args.output_file = args.config_file
    with open(args.output_file, "w") as handle:
        yaml.dump(convert_config_to_fsdp2(config), handle)


def to_fsdp2_command_parser(subparsers=None):
    """The ``to-fsdp2`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    description = "Convert an Accelerate config from FSDP1 to FSDP2"
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", description=description, help=description)
    else:
        parser = CustomArgumentParser(description=description)
    parser.add_argument("--config_file", type=str, required=True, help="The config file to convert to FSDP2")
    parser.add_argument("--overwrite", action="store_true", default=False, help="Overwrite the config file if it exists")
    parser.add_argument("--output_file", type=str, default=None, help="where to write (default: over --config_file, with --overwrite)")
    if subparsers is not None:
        parser.set_defaults(func=to_fsdp2_command)
    return parser
