"""The environment and command lines the launcher gives its ranks (🤗 Accelerate's ``utils.launch``).

The variables are the ones 🤗 Accelerate's own launcher sets, so a script written
for it runs unchanged under ``accelerate-ref launch`` (catalog ``launch.cli``):
``ACCELERATE_USE_CPU``, ``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_DEBUG_MODE``,
``ACCELERATE_DYNAMO_*``, ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, and the
rendezvous address ``MASTER_ADDR`` / ``MASTER_PORT``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from .dataclasses import DynamoBackend, PrecisionType

LOOPBACK = "127.0.0.1"


def is_port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """Whether something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = LOOPBACK) -> int:
    """A port the kernel says is free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _precision(value: str | None) -> str:
    value = (value or "no").lower()
    try:
        return str(PrecisionType(value).value)
    except ValueError:
        if value == "fp8":
            return value
        raise ValueError(f"unknown mixed_precision {value!r}; choose one of no, fp16, bf16, fp8") from None


def _dynamo(value: str | None) -> str:
    try:
        return DynamoBackend((value or "no").upper()).value
    except ValueError:
        raise ValueError(f"unknown dynamo_backend {value!r}") from None


def launch_env(args: argparse.Namespace, base: dict[str, str] | None = None) -> dict[str, str]:
    """The ``ACCELERATE_*`` variables every rank gets, on top of ``base`` (default: this process's environment)."""
    env = dict(os.environ if base is None else base)
    env["ACCELERATE_USE_CPU"] = str(bool(getattr(args, "cpu", False) or getattr(args, "use_cpu", False)))
    env["ACCELERATE_MIXED_PRECISION"] = _precision(getattr(args, "mixed_precision", None))
    env["ACCELERATE_DYNAMO_BACKEND"] = _dynamo(getattr(args, "dynamo_backend", None))
    env["ACCELERATE_DYNAMO_MODE"] = getattr(args, "dynamo_mode", None) or "default"
    env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = str(bool(getattr(args, "dynamo_use_fullgraph", False)))
    env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(bool(getattr(args, "dynamo_use_dynamic", False)))
    env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = "False"
    if getattr(args, "debug", False):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if getattr(args, "gradient_accumulation_steps", None) is not None:
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(args.gradient_accumulation_steps)
    gpu_ids = getattr(args, "gpu_ids", None)
    if gpu_ids not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids
    return env


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """One process: the command (``python [-m] script args``) and its environment.

    With more than one machine, ``main_process_ip`` and ``main_process_port`` are required.
    """
    if getattr(args, "module", False) and getattr(args, "no_python", False):
        raise ValueError("--module and --no_python cannot be used together")
    cmd = [] if getattr(args, "no_python", False) else [sys.executable] + (["-m"] if getattr(args, "module", False) else [])
    cmd += [args.training_script, *args.training_script_args]
    env = launch_env(args)
    num_machines = getattr(args, "num_machines", None) or 1
    if num_machines > 1 and (args.main_process_ip is None or args.main_process_port is None):
        raise ValueError("with several machines, --main_process_ip and --main_process_port are required")
    if (getattr(args, "num_processes", None) or 1) > 1 or num_machines > 1:
        env["MASTER_ADDR"] = args.main_process_ip or LOOPBACK
        env["MASTER_PORT"] = str(args.main_process_port or 29500)
    return cmd, env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment for a ``torch.distributed.run`` launch; fills ``args.nproc_per_node``,
    ``args.nnodes``, ``args.node_rank``, ``args.master_addr``, ``args.master_port`` for its command line.

    ``main_process_port`` None or 0 picks a free port (one machine only: other machines must be told it).
    """
    num_machines = getattr(args, "num_machines", None) or 1
    num_processes = args.num_processes
    if num_processes % num_machines:
        raise ValueError(f"--num_processes {num_processes} is not a multiple of --num_machines {num_machines}")
    args.nproc_per_node = str(num_processes // num_machines)
    args.nnodes = str(num_machines)
    args.node_rank = str(getattr(args, "machine_rank", 0) or 0)
    args.master_addr = args.main_process_ip or LOOPBACK
    if not args.main_process_port:
        if num_machines > 1:
            raise ValueError("with several machines, --main_process_port is required")
        args.main_process_port = free_port()
    args.master_port = str(args.main_process_port)
    env = launch_env(args)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def torchrun_argv(args: argparse.Namespace) -> list[str]:
    """The ``torch.distributed.run`` command line (after ``prepare_multi_gpu_env``)."""
    argv = [
        "--nproc_per_node", args.nproc_per_node,
        "--nnodes", args.nnodes,
        "--node_rank", args.node_rank,
        "--master_addr", args.master_addr,
        "--master_port", args.master_port,
        "--monitor_interval", "0.1",
    ]
    if getattr(args, "module", False):
        argv.append("--module")
    return argv + [args.training_script, *args.training_script_args]
