"""Probes of ``accelerate.launchers``: ``notebook_launcher``'s checks, refusals and printed lines, what it hands to
torch's elastic agent, ``debug_launcher``'s fork, and ``test_launch``.

No probe forks ranks: torch's launch entry points (``elastic_launch``, ``start_processes``) are replaced for the
call by recorders of what they were given and of the environment they saw, so each probe runs in milliseconds.
The conformance cases ``launch.notebook_launcher`` and ``launch.debug_launcher`` run the real launches.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from typing import Any, Iterator

import torch.distributed.launcher.api as elastic_api
import torch.multiprocessing as torch_mp
from torch.multiprocessing.spawn import ProcessRaisedException

from ..probe import Api, probe

AREA = "launchers"
NOTEBOOK = "launchers.notebook_launcher"
#: The variables a launch sets for its ranks, read while torch's entry point is called.
LAUNCH_ENV = ("NPROC", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MIXED_PRECISION", "ACCELERATE_USE_CPU",
              "GLOO_SOCKET_IFNAME", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "FORK_LAUNCHED")
#: What an Accelerator in a rank reads its mixed precision from (recorded apart: see DIFFERENTIAL.toml).
PRECISION_ENV = "ACCELERATE_MIXED_PRECISION"
#: The LaunchConfig fields a notebook launch chooses.
CONFIG_FIELDS = ("min_nodes", "max_nodes", "nproc_per_node", "run_id", "rdzv_endpoint", "rdzv_backend",
                 "rdzv_configs", "max_restarts", "monitor_interval", "start_method", "log_line_prefix_template")


def _train(log: list, *args: Any) -> None:
    """A training function: records that it ran, with its arguments."""
    log.append(["ran", *args])


def _launch_environment() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in LAUNCH_ENV}


@contextlib.contextmanager
def _recording_launches(start_processes_raises: BaseException | None = None) -> Iterator[list]:
    """Replace torch's ``elastic_launch`` and ``start_processes`` with recorders; yield what they saw (the last
    item: the ``ACCELERATE_MIXED_PRECISION`` each launch saw, in order)."""
    seen: list = []
    precisions: list = []

    def elastic_launch(config: Any, entrypoint: Any) -> Any:
        def launch(*args: Any) -> None:
            fields = {name: getattr(config, name) for name in CONFIG_FIELDS}
            seen.append({"elastic_launch": fields, "entrypoint": getattr(entrypoint, "__name__", None),
                         "args": list(args), "environment": _launch_environment()})
            precisions.append(os.environ.get(PRECISION_ENV))
        return launch

    def start_processes(launcher: Any, args: tuple = (), nprocs: int = 1, start_method: str = "spawn", **_: Any) -> None:
        store = os.environ.get("ACCELERATE_DEBUG_RDV_FILE")
        seen.append({"start_processes": {"nprocs": nprocs, "start_method": start_method, "args": list(args)},
                     "launcher": {"class": type(launcher).__name__, "debug": launcher.debug,
                                  "distributed_type": launcher.distributed_type,
                                  "function": getattr(launcher.launcher, "__name__", None)},
                     "environment": _launch_environment(),
                     "file store exists": None if store is None else os.path.exists(store)})
        precisions.append(os.environ.get(PRECISION_ENV))
        if start_processes_raises is not None:
            raise start_processes_raises

    saved = elastic_api.elastic_launch, torch_mp.start_processes
    elastic_api.elastic_launch, torch_mp.start_processes = elastic_launch, start_processes
    try:
        yield seen
    finally:
        elastic_api.elastic_launch, torch_mp.start_processes = saved
        seen.append({PRECISION_ENV: precisions})


@contextlib.contextmanager
def _imported(name: str) -> Iterator[None]:
    """``name`` in ``sys.modules`` (an empty module), as after ``import name``."""
    had = name in sys.modules
    previous = sys.modules.get(name)
    sys.modules[name] = types.ModuleType(name)
    try:
        yield
    finally:
        if had:
            sys.modules[name] = previous
        else:
            del sys.modules[name]


@probe(AREA)
def test_launch(api: Api) -> None:
    api.call("test_launch", "launchers.test_launch")
    api.observe("the state it made", lambda: api.get("PartialState")().distributed_type)


@probe(AREA)
def notebook_launcher_checks(api: Api) -> None:
    """The argument checks, in order, and the single-process launch (which runs the function in place)."""
    log: list = []
    api.call("an unknown mixed precision", NOTEBOOK, _train, (log,), num_processes=2, mixed_precision="fp9")
    api.call("mixed precision not a string", NOTEBOOK, _train, (log,), num_processes=2, mixed_precision=None)
    api.call("no num_processes", NOTEBOOK, _train, (log,))
    api.call("node_rank not below num_nodes", NOTEBOOK, _train, (log,), num_processes=2, node_rank=1)
    api.call("one process", NOTEBOOK, _train, (log, "a", 1), num_processes=1)
    api.call("one process, upper-case mixed precision", NOTEBOOK, _train, (log,), num_processes=1, mixed_precision="BF16")
    api.accelerator()
    api.call("one process, an Accelerator exists", NOTEBOOK, _train, (log,), num_processes=1)
    api.record("the function's runs", log)


@probe(AREA)
def notebook_launcher_refusals(api: Api) -> None:
    """Several processes: refused after ``import bitsandbytes``, and once an Accelerator exists (checked first)."""
    log: list = []
    with _recording_launches() as launches, _imported("bitsandbytes"):
        api.call("bitsandbytes imported", NOTEBOOK, _train, (log,), num_processes=2)
        api.accelerator()
        api.call("an Accelerator exists and bitsandbytes imported", NOTEBOOK, _train, (log,), num_processes=2)
    with _recording_launches() as more:
        api.call("an Accelerator exists", NOTEBOOK, _train, (log,), num_processes=2)
    api.record("launches", launches + more)
    api.record("the function's runs", log)


@probe(AREA)
def notebook_launcher_launch(api: Api) -> None:
    """What a launch of several processes hands to torch's elastic agent, prints, and the environment it sets."""
    log: list = []
    with _recording_launches() as launches:
        api.call("2 processes", NOTEBOOK, _train, (log, "x"), num_processes=2, use_port="29611")
        api.call("2 processes in fp16", NOTEBOOK, _train, (log,), num_processes=2, mixed_precision="FP16")
        api.call("2 nodes, a c10d rendezvous", NOTEBOOK, _train, (log,), num_processes=2, num_nodes=2, node_rank=1,
                 rdzv_backend="c10d", rdzv_endpoint="10.0.0.1:29400", rdzv_conf={"timeout": 60}, rdzv_id="job7",
                 max_restarts=2, monitor_interval=0.5, log_line_prefix_template="[{rank}]")
        api.call("static, an explicit endpoint", NOTEBOOK, _train, (log,), num_processes=3, master_addr="10.0.0.2",
                 rdzv_endpoint="10.0.0.3:1234", rdzv_conf={"a": 1})
    *configs, precisions = launches
    api.record("launches", configs)
    api.record(f"launches: {PRECISION_ENV}", precisions)
    api.observe("the environment after", _launch_environment)
    api.record("the function's runs", log)


@probe(AREA, env={"ACCELERATE_DEBUG_MODE": "true"})
def notebook_launcher_checks_the_environment_first(api: Api) -> None:
    """``ACCELERATE_DEBUG_MODE=true``: a first fork of ``test_launch`` checks that ranks start; its failures."""
    log: list = []
    with _recording_launches() as launches:
        api.call("the ranks start", NOTEBOOK, _train, (log,), num_processes=2)
    forked = ProcessRaisedException("RuntimeError: Cannot re-initialize CUDA in forked subprocess.", 1, 4321)
    with _recording_launches(forked) as after_cuda:
        api.call("CUDA initialised before the fork", NOTEBOOK, _train, (log,), num_processes=2)
    other = ProcessRaisedException("ValueError: something else", 0, 4320)
    with _recording_launches(other) as after_other:
        api.call("another failure", NOTEBOOK, _train, (log,), num_processes=2)
    api.record("launches", launches[:-1] + after_cuda[:-1] + after_other[:-1])
    api.record(f"launches: {PRECISION_ENV}", [launches[-1], after_cuda[-1], after_other[-1]])
    api.record("the function's runs", log)


@probe(AREA, env={"KAGGLE_KERNEL_RUN_TYPE": "Interactive"})
def notebook_launcher_in_kaggle(api: Api) -> None:
    """A Kaggle kernel: without a TPU the usual launch; with one (``TPU_NAME`` or ``PJRT_DEVICE=TPU``) torch-xla's."""
    log: list = []
    api.call("no TPU", NOTEBOOK, _train, (log,), num_processes=1)
    with _recording_launches() as launches:
        os.environ["PJRT_DEVICE"] = "TPU"
        api.call("PJRT_DEVICE=TPU", NOTEBOOK, _train, (log,), num_processes=2)
        del os.environ["PJRT_DEVICE"]
        os.environ["TPU_NAME"] = "tpu"
        api.call("TPU_NAME", NOTEBOOK, _train, (log,))
    api.record("launches", launches)
    api.record("the function's runs", log)


@probe(AREA)
def debug_launcher(api: Api) -> None:
    """What ``debug_launcher`` hands to ``torch.multiprocessing.start_processes``, and the environment around it."""
    log: list = []
    with _recording_launches() as launches:
        api.call("defaults", "launchers.debug_launcher", _train, (log,))
        api.call("3 processes", "launchers.debug_launcher", _train, (log, "y"), num_processes=3)
    failed = ProcessRaisedException("\n\n-- Process 1 terminated with the following error:\nValueError: no", 1, 99)
    with _recording_launches(failed):
        api.call("a rank raises", "launchers.debug_launcher", _train, (log,))
    api.record("launches", launches)
    api.observe("the environment after", _launch_environment)
    api.record("the function's runs", log)
