"""Command line: ``python -m simulators launch -n 4 [--machines 2] [--timeout S] [--] script.py args...``.

The exit status is the launcher's: 0, the failing rank's status (128 +
signal for a signal), 124 at the timeout, 2 for a bad command line.
"""
from __future__ import annotations

import argparse
import sys

from simulators.capacity import check_world
from simulators.cli import OneLineParser
from simulators.collectives import DEBUG_ENV
from simulators.launcher import launch
from simulators.topology import World


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="simulators", description="Run ranks on one machine over gloo on loopback.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("launch", help="run a script on every rank of a world")
    run.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks in all")
    run.add_argument("--machines", type=int, default=1, help="simulated machines to spread them over (default 1)")
    run.add_argument("--timeout", type=float, default=None, help="seconds before the ranks' stacks are dumped and they are killed")
    run.add_argument("--debug-collectives", action="store_true",
                     help="run ranks under TORCH_DISTRIBUTED_DEBUG=DETAIL: mismatched collectives fail at once")
    run.add_argument("script", help="the Python script each rank runs")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m simulators`` and the ``simulators`` console script."""
    parser = _parser()
    options = parser.parse_args(argv)
    try:
        world = World.of(options.nproc, machines=options.machines)
        check_world(world)
        env = DEBUG_ENV if options.debug_collectives else None
        result = launch([options.script, *options.args], world, timeout=options.timeout, env=env)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
