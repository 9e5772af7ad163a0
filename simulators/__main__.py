"""Command line: ``python -m simulators launch -n 4 [--machines 2] [--timeout S] [--] script.py args...``.

``--device npu|xla|cuda`` runs the ranks on a mock accelerator family
(:mod:`simulators.devices`); with it, ``--device-count N`` gives every rank
N devices of its own and ``--device-memory 64MB`` a budget per device
(:mod:`simulators.devices.families.machine`). The ranks are forked from a fork server
that imported torch and the fork-safe libraries the script imports
(:func:`simulators.dryrun.preload`), as a dry run's are.

The exit status is the launcher's: 0, the failing rank's status (128 +
signal for a signal), 124 at the timeout, 2 for a bad command line.
"""
from __future__ import annotations

import argparse
import sys

from simulators.capacity import check_world
from simulators.cli import OneLineParser
from simulators.flight_recorder import DEBUG_ENV
from simulators.devices import KINDS, world_settings
from simulators.devices.families.machine import machine_env
from simulators.dryrun import preload
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
    run.add_argument("--device", choices=KINDS, help="run the ranks on this mock accelerator (default: CPU only)")
    run.add_argument("--device-count", help="mock devices every rank sees (default: one per rank of its machine)")
    run.add_argument("--device-memory", help="memory budget of each mock device: bytes, 64MB, 500MiB (default: none)")
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
        env, pythonpath = _device_settings(options)
        if options.debug_collectives:
            env = {**(env or {}), **DEBUG_ENV}
        result = launch([options.script, *options.args], world, timeout=options.timeout, env=env, pythonpath=pythonpath,
                        preload=preload(options.script))
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    return result.exit_code


def _device_settings(options: argparse.Namespace) -> tuple[dict[str, str], tuple[str, ...]]:
    """The ranks' environment and first import path entries for ``--device`` and its machine options."""
    if options.device is None:
        if options.device_count is not None or options.device_memory is not None:
            raise ValueError("--device-count and --device-memory need --device npu or --device xla")
        return {}, ()
    settings = world_settings(options.device)
    machine = machine_env(options.device, options.device_count, options.device_memory)
    return {**settings.env, **machine}, settings.pythonpath


if __name__ == "__main__":
    sys.exit(main())
