"""``accelerate-ref config update``: rewrite a config file with today's defaults, keeping its settings."""

from __future__ import annotations

import argparse
import os

from .config_args import ConfigError, current_default_config_file, default_config_file, load_config_from_file  # noqa: F401
from .config_utils import SubcommandHelpFormatter

description = "Update an existing config file with the latest defaults while maintaining the old configuration."


def update_config(args):
    """Read ``args.config_file`` (default: the default config, which must exist), write it back; return its path.

    A ``--config_file`` that does not exist is 🤗 Accelerate's ValueError. Without ``--config_file`` and without a
    default file, a ConfigError says so (🤗 Accelerate 1.15 fails there with a TypeError from ``Path(None)``).
    """
    config_file = args.config_file
    if config_file is None:
        config_file = current_default_config_file()
        if not os.path.isfile(config_file):
            raise ConfigError(f"no config file to update: {config_file} does not exist (pass --config_file)")
    elif not os.path.isfile(config_file):
        raise ValueError(f"The passed config file located at {config_file} doesn't exist.")
    config = load_config_from_file(config_file)
    if config_file.endswith(".json"):
        config.to_json_file(config_file)
    else:
        config.to_yaml_file(config_file)
    return config_file


def update_config_command(args: argparse.Namespace) -> None:
    config_file = update_config(args)
    print(f"Successfully updated the configuration file at {config_file}.")


def update_command_parser(parser, parents):
    """Add ``update`` to the ``config`` subcommands ``parser``."""
    parser = parser.add_parser("update", parents=parents, help=description, formatter_class=SubcommandHelpFormatter)
    parser.add_argument("--config_file", "--config-file", default=None, help="the config file to update (default: the default one)")
    parser.set_defaults(func=update_config_command)
    return parser
