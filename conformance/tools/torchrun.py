"""The suite's native path started as a GPU runner starts it: ``torch.distributed.run`` (torchrun), on this host.

``run_native(impl, world, ...)`` starts ``python -m torch.distributed.run ... -m conformance run --backend native``
for a world of M machines of N ranks: one torchrun agent for one machine (static rendezvous on a free
``--master_port``), M agents on localhost with a ``c10d`` rendezvous for several (torchrun's real multi-node path:
each agent is a machine, ranks are numbered machine by machine). It waits with a timeout, stops every agent and
rank after it (each agent leads a process group of its own), and returns the run rank 0 wrote as JSON. An agent
starts as ``simulators.fork_root.start_module`` starts a module: it dies with the process that started it (whatever
ends that; its ranks then lose their store and exit), and it is forked from the root fork server named in the
environment when there is one (a test suite's: torch imported once), spawned otherwise. Its ranks are torchrun's own
``python`` processes either way.

On a CPU-only machine the ranks get ``ACCELERATE_USE_CPU=1`` (what the simulator's CPU worlds set, the variable
HF accelerate needs to see MULTI_CPU under a torchrun launch) unless the caller's environment says otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from simulators.fork_root import RootChild, start_module
from simulators.ports import free_port
from simulators.spawn import signal_quietly
from simulators.topology import World

from ..engine import report
from ..support.launching import imported_folders
from ..engine.runner import Run

#: Seconds a native run of the whole suite at one world may take here, beyond which every agent is stopped.
DEFAULT_TIMEOUT_S = 900.0


class NativeRunError(Exception):
    """A native run that produced no report: its agents failed, or it ran past its timeout."""


@dataclass
class NativeRun:
    """A finished torchrun launch of the suite: its report, and each agent's exit status and output."""

    run: Run
    returncodes: list[int]
    outputs: list[str]


def torchrun_arguments(impl: str, world: World, machine: int, port: int, run_id: str, args: Sequence[str]) -> list[str]:
    """The arguments of ``python -m torch.distributed.run`` for ``machine`` of ``world`` (the README's command, with
    the rendezvous of one host)."""
    launcher = ["--nproc_per_node", str(world.ranks_per_machine)]
    if world.machines == 1:
        launcher += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    else:
        launcher += ["--nnodes", str(world.machines), "--node_rank", str(machine), "--rdzv_backend", "c10d",
                     "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", run_id, "--local_addr", "127.0.0.1"]
    return [*launcher, "-m", "conformance", "run", "--backend", "native", "--impl", impl, *args]


def run_native(
    impl: str,
    world: World,
    patterns: Sequence[str] = (),
    *,
    case_timeout: float | None = None,
    manifest: bool = False,
    env: dict[str, str] | None = None,
    pythonpath: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
) -> NativeRun:
    """Run the suite's cases matching ``patterns`` natively at ``world`` against ``impl``; raise NativeRunError
    when no report came back (the agents' output in the message)."""
    with tempfile.TemporaryDirectory(prefix="conformance-torchrun-") as folder:
        json_path = Path(folder) / "run.json"
        args = ["--json", str(json_path)]
        for pattern in patterns:
            args += ["-k", pattern]
        if case_timeout is not None:
            args += ["--case-timeout", str(case_timeout)]
        if not manifest:
            args.append("--no-manifest")
        port, run_id = free_port(), uuid.uuid4().hex[:12]
        ranks_env = _ranks_env(env, pythonpath, store_port=free_port() if world.machines > 1 else None)
        agents = [_start_agent(torchrun_arguments(impl, world, machine, port, run_id, args), ranks_env,
                               Path(folder) / f"agent-{machine}.log")
                  for machine in range(world.machines)]
        outputs, codes = _finish(agents, timeout)
        if not json_path.exists():
            raise NativeRunError(f"torchrun at world {world.label} wrote no report (exit statuses {codes}):\n"
                                 + "\n".join(out[-3000:] for out in outputs))
        return NativeRun(report.read_json(json_path), codes, outputs)


def _ranks_env(env: dict[str, str] | None, pythonpath: Sequence[str], store_port: int | None) -> dict[str, str]:
    ranks_env = dict(os.environ)
    ranks_env.setdefault("OMP_NUM_THREADS", "1")
    if not _has_accelerator():
        ranks_env.setdefault("ACCELERATE_USE_CPU", "1")
    paths = [*pythonpath, *[p for p in ranks_env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    ranks_env["PYTHONPATH"] = os.pathsep.join(paths + imported_folders(paths))
    if store_port is not None:
        ranks_env["CONFORMANCE_STORE_PORT"] = str(store_port)
    ranks_env.update(env or {})
    return ranks_env


def _has_accelerator() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class _Agent:
    """A started torchrun agent and the file its output (stdout and stderr) goes to."""

    process: subprocess.Popen | RootChild
    log: Path


def _start_agent(arguments: list[str], env: dict[str, str], log: Path) -> _Agent:
    """Start ``python -m torch.distributed.run *arguments`` in ``log``'s folder with ``env``, as the leader of a
    process group of its own, its output in ``log``."""
    with open(log, "wb") as output, open(os.devnull, "rb") as stdin:
        process = start_module("torch.distributed.run", arguments, env, stdin=stdin.fileno(), stdout=output.fileno(),
                               stderr=output.fileno(), cwd=str(log.parent), new_session=True)
    return _Agent(process, log)


def _finish(agents: list[_Agent], timeout: float) -> tuple[list[str], list[int]]:
    """Wait for every agent until ``timeout`` (then stop them all); kill what is left of each group after."""
    deadline = time.monotonic() + timeout
    notes = []
    try:
        for agent in agents:
            try:
                agent.process.wait(max(0.1, deadline - time.monotonic()))
                notes.append("")
            except subprocess.TimeoutExpired:
                for other in agents:
                    signal_quietly(os.killpg, other.process.pid, signal.SIGTERM)
                agent.process.wait(30)
                notes.append(f"\n[stopped: the launch ran past {timeout:g} s]")
    finally:
        for agent in agents:
            signal_quietly(os.killpg, agent.process.pid)
            agent.process.wait()
    outputs = [agent.log.read_text(errors="replace") + note for agent, note in zip(agents, notes)]
    return outputs, [agent.process.returncode for agent in agents]
