"""``accelerate-ref launch --simulate cpu|cuda|xla|npu``: a dry run of a user's unmodified script on simulated ranks.

Rule: the script runs on ``num_processes`` simulator ranks as
``num_machines`` machines with the environment ``launch`` would give it (HF
accelerate's launch variables; ``ACCELERATE_USE_CPU`` for ``cpu``) plus the
simulator's for the family (:func:`simulators.dryrun.family_env`); then the
simulator's run summary is printed and the launch's exit status returned.
The simulator knows no implementation: it takes argv, world, environment and
timeout.
"""

from __future__ import annotations

import argparse

from ..utils.launch import launch_env


def dry_run(args: argparse.Namespace) -> int:
    """Run ``args.training_script`` on the simulator and print the summary; return the launcher's exit status."""
    from simulators.dryrun import DEFAULT_TIMEOUT, family_env, summary
    from simulators.launcher import launch
    from simulators.topology import World

    if args.module or args.no_python:
        raise ValueError("--simulate runs a script file; -m and --no_python are not supported with it")
    world = World.of(args.num_processes, machines=args.num_machines)
    env = {**launch_env(args, base={}), "ACCELERATE_USE_CPU": str(args.simulate == "cpu" or bool(args.cpu)),
           **family_env(args.simulate)}
    result = launch([args.training_script, *args.training_script_args], world,
                    timeout=args.timeout or DEFAULT_TIMEOUT, env=env)
    print(summary(result, world, args.training_script), flush=True)
    return result.exit_code
