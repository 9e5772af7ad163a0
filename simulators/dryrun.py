"""``accelerate-ref launch --simulate cpu|cuda|xla|npu``: a dry run of a user's unmodified script on simulated ranks.

The script runs on the simulator's ranks (``simulators.launcher.launch``: N
ranks as M machines, gloo on loopback) with 🤗 Accelerate's launch
environment and, for ``cuda`` / ``xla`` / ``npu``, that family's mock device first on
every rank's import path. Afterwards a run summary lists, per rank, its exit
status; every device-mixing error with the file and line of the user's code
that caused it; every XLA step recompilation with the shapes that changed;
and, for a run stopped at ``--timeout``, the Python stack of every rank
still running. On ``cuda`` a GPU script runs as written for GPUs (HF
accelerate picks ``MULTI_GPU`` over ``nccl``; see :mod:`simulators.devices.cuda`
for what the mock takes over from a CPU-only torch).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from simulators.launcher import LaunchResult, launch
from simulators.topology import World

#: Seconds a dry run may take when ``--timeout`` is not given.
DEFAULT_TIMEOUT = 600.0
MIXING = re.compile(r"Expected all tensors to be on the same device[^\n]*")
RECOMPILATION = re.compile(r"XLA recompilation at step[^\n]*")
FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _env(args: argparse.Namespace) -> dict[str, str]:
    from accelerate_ref.utils.launch import launch_env

    env = {key: value for key, value in launch_env(args, base={}).items()}
    env["ACCELERATE_USE_CPU"] = str(args.simulate == "cpu" or bool(args.cpu))
    env["OMP_NUM_THREADS"] = "1"
    from simulators.devices import KINDS, world_settings

    if args.simulate in KINDS:
        settings = world_settings(args.simulate)
        env.update(settings.env)
        env["PYTHONPATH"] = os.pathsep.join([*settings.pythonpath, *filter(None, sys.path)])
    return env


def _user_frame(traceback_text: str, script: str) -> str:
    """``file:line`` of the last traceback frame in the user's script (else the last frame outside packages)."""
    frames = FRAME.findall(traceback_text)
    script = os.path.abspath(script)
    mine = [f for f in frames if os.path.abspath(f[0]) == script]
    outside = [f for f in frames if "site-packages" not in f[0] and "/simulators/" not in f[0]]
    chosen = (mine or outside or frames or [("?", "?")])[-1]
    return f"{chosen[0]}:{chosen[1]}"


def summary(result: LaunchResult, world: World, script: str) -> str:
    """The run summary printed after a dry run."""
    lines = [f"== dry run summary: {world.size} ranks as {world.machines} machine(s), {result.status} =="]
    for rank in range(world.size):
        if rank in result.running:
            state = "still running at the timeout (stopped)"
        elif rank in result.exit_codes:
            code = result.exit_codes[rank]
            state = "exit 0" if code == 0 else (f"signal {-code}" if code < 0 else f"exit {code}")
        else:
            state = "stopped after another rank failed"
        lines.append(f"rank {rank}: {state}")
    for rank, tail in sorted(result.output_tail.items()):
        for match in MIXING.finditer(tail):
            lines.append(f"rank {rank}: device mixing at {_user_frame(tail[: match.end()], script)}: {match.group(0)}")
        for match in RECOMPILATION.finditer(tail):
            lines.append(f"rank {rank}: {match.group(0)}")
    for rank, stack in sorted(result.stacks.items()):
        lines.append(f"--- rank {rank} stack ---\n{stack.rstrip()}")
    return "\n".join(lines)


def dry_run(args: argparse.Namespace) -> int:
    """Run ``args.training_script`` on the simulator and print the summary; return the launcher's exit status."""
    if args.module or args.no_python:
        raise ValueError("--simulate runs a script file; -m and --no_python are not supported with it")
    world = World.of(args.num_processes, machines=args.num_machines)
    result = launch(
        [args.training_script, *args.training_script_args],
        world,
        timeout=args.timeout or DEFAULT_TIMEOUT,
        env=_env(args),
    )
    print(summary(result, world, args.training_script), flush=True)
    return result.exit_code
