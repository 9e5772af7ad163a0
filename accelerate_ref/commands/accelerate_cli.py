"""The ``accelerate-ref`` console script: ``config`` (``default``, ``update``), ``estimate-memory``, ``env``,
``launch``, ``merge-weights``, ``tpu-config``, ``test``, ``to-fsdp2`` (🤗 Accelerate 1.15's commands).

Every error is one line on stderr: usage errors (unknown flag, bad value,
missing script, bad config, port in use, a model or library that cannot be
loaded) exit 2, a failed launch exits 1.
"""

from __future__ import annotations

import argparse
import sys

from . import config as config_commands
from .config.config import PromptError
from .config.config_args import ConfigError
from .env import env_command_parser
from .estimate import estimate_command_parser
from .launch import LaunchError, RankFailure, launch_command_parser
from .merge import merge_command_parser
from .test import test_command_parser
from .to_fsdp2 import to_fsdp2_command_parser
from .tpu import tpu_command_parser
from .utils import CustomArgumentParser


class OneLineParser(CustomArgumentParser):
    """A ``CustomArgumentParser`` (every subcommand's options take ``_`` and ``-`` spellings, as under 🤗
    Accelerate's console script) whose errors are one line (``prog: error: message``) and exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser("accelerate-ref", allow_abbrev=False)
    subparsers = parser.add_subparsers(dest="cli_command", parser_class=OneLineParser)  # not "command": tpu-config has --command
    for add in (config_commands.get_config_parser, estimate_command_parser, env_command_parser, launch_command_parser, merge_command_parser,
                tpu_command_parser, test_command_parser, to_fsdp2_command_parser):
        add(subparsers)
    return parser


def run(argv: list[str]) -> int:
    """Run the command line ``argv`` (without the program name); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    prog = f"accelerate-ref {args.cli_command}"
    args.cli_argv = list(argv)  # the command line itself, for a command that runs variations of it (launch --fit)
    try:
        code = args.func(args)
        return 0 if code is None else code
    except ChildProcessError as error:  # a command it ran (gcloud, the deepspeed runner) failed
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except (LaunchError, ConfigError, PromptError, ValueError, OSError, ImportError, RuntimeError) as error:
        message = " ".join(line.strip() for line in str(error).splitlines())  # a library's multi-line text, on one line
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except RankFailure as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def main():
    """The ``accelerate-ref`` console script: runs ``sys.argv[1:]``, returns the exit status."""
    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
