"""``accelerate-ref test``: a short distributed self-check (catalog ``launch.test``).

Runs a subset of the conformance suite (process control, collectives, one
training step) against the configured implementation in the configured world
(``num_processes`` ranks of the config, at least 2 unless ``--num_processes``
says otherwise) and exits non-zero on any failure: the drop-in for
``accelerate test`` in a CI job.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from .config.config_args import ConfigError, launch_config

#: Conformance case patterns the self-check runs: cheap and covering the distributed basics.
SELF_CHECK = ("state.attributes", "process.is_main", "gather.*", "reduce.doc_example", "broadcast.*", "sync.wait_for_everyone")


def test_command(args: argparse.Namespace) -> int:
    try:
        config = launch_config(args.config_file)
    except ConfigError as error:
        raise ValueError(str(error)) from None
    ranks = args.num_processes or max(getattr(config, "num_processes", 0) or 0, 2)
    command = [
        sys.executable, "-m", "conformance", "run",
        "--impl", args.impl, "--backend", args.backend,
        "--worlds", str(ranks), "--case-timeout", "60",
        *(argument for pattern in SELF_CHECK for argument in ("-k", pattern)),
    ]
    print(f"Running the accelerate-ref self-check: {args.impl} on {ranks} ranks ({args.backend})", flush=True)
    code = subprocess.call(command)
    print("Test is a success! You are ready for your distributed training!" if code == 0 else "Self-check FAILED", flush=True)
    return 0 if code == 0 else 1


def test_command_parser(subparsers=None):
    """The ``test`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser("test", help="run a short distributed self-check")
    else:
        parser = argparse.ArgumentParser("accelerate-ref test command")
    parser.add_argument("--config_file", "--config-file", default=None)
    parser.add_argument("--num_processes", "--num-processes", type=int, default=None)
    parser.add_argument("--impl", default="accelerate_ref", help="implementation module under test")
    parser.add_argument("--backend", default="sim", choices=["sim", "sim-xla", "sim-npu", "native"])
    if subparsers is not None:
        parser.set_defaults(func=test_command)
    return parser


def main():
    """``python -m accelerate_ref.commands.test``: the self-check; exits with its status."""
    raise SystemExit(test_command(test_command_parser().parse_args()))


if __name__ == "__main__":
    main()
