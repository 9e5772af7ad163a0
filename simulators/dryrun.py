"""What a dry run needs of the simulator: the environment of a device family, and the run summary.

The dry run itself is a command's (``accelerate-ref launch --simulate
cpu|cuda|xla|npu``, :mod:`accelerate_ref.commands.dry_run`): it runs a user's
unmodified script on the simulator's ranks (``simulators.launcher.launch``: N
ranks as M machines, gloo on loopback) with its launch environment plus
:func:`family_env` (for ``cuda`` / ``xla`` / ``npu``, that family's mock device
first on every rank's import path). Afterwards :func:`summary` lists, per rank, its exit
status; every device-mixing error with the file and line of the user's code
that caused it; every XLA step recompilation with the shapes that changed;
and, for a run stopped at ``--timeout``, the Python stack of every rank
still running. On ``cuda`` a GPU script runs as written for GPUs (HF
accelerate picks ``MULTI_GPU`` over ``nccl``; see :mod:`simulators.devices.cuda`
for what the mock takes over from a CPU-only torch).
"""

from __future__ import annotations

import os
import re
import sys

from simulators.launcher import LaunchResult
from simulators.topology import World

#: Seconds a dry run may take when ``--timeout`` is not given.
DEFAULT_TIMEOUT = 600.0
MIXING = re.compile(r"Expected all tensors to be on the same device[^\n]*")
RECOMPILATION = re.compile(r"XLA recompilation at step[^\n]*")
FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def family_env(family: str) -> dict[str, str]:
    """The environment every rank of a dry run on ``family`` gets from the simulator: one thread, and for a
    mock device family its settings with its sites first on the import path."""
    from simulators.devices import KINDS, world_settings

    env = {"OMP_NUM_THREADS": "1"}
    if family in KINDS:
        settings = world_settings(family)
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
