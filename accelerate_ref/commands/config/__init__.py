"""``accelerate-ref config``: the launcher's YAML config, read and written in 🤗 Accelerate's format.

``config`` asks on stdin, ``config default`` writes ``write_basic_config``'s file,
``config update`` rewrites a file with today's defaults.
"""

import argparse

from .config import config_command_parser
from .config_args import ClusterConfig, ConfigError, default_config_file, load_config_from_file  # noqa: F401
from .default import default_command_parser, write_basic_config  # noqa: F401
from .update import update_command_parser


def get_config_parser(subparsers=None):
    """The ``config`` parser with its ``default`` and ``update`` subcommands."""
    parent_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    config_parser = config_command_parser(subparsers)
    subcommands = config_parser.add_subparsers(title="subcommands", dest="subcommand")
    default_command_parser(subcommands, parents=[parent_parser])
    update_command_parser(subcommands, parents=[parent_parser])
    return config_parser


def main():
    """``python -m accelerate_ref.commands.config``: run the ``config`` command line alone."""
    config_parser = get_config_parser()
    args = config_parser.parse_args()
    if not hasattr(args, "func"):
        config_parser.print_help()
        raise SystemExit(1)
    args.func(args)


if __name__ == "__main__":
    main()
