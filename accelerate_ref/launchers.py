"""``notebook_launcher`` and ``debug_launcher``: several ranks from one Python process.

``notebook_launcher(fn, args, num_processes=N)`` forks N ranks with torch's
elastic agent (``torch.distributed.launcher.api.elastic_launch``, start method
``fork``, as documented for notebooks); each runs ``fn(*args)`` as one rank of
a torchrun-style world. The ``Accelerator`` must be created inside ``fn``: one
created before the call is refused with a ``ValueError`` saying so (catalog
``launch.notebook_launcher``). In Colab or a Kaggle kernel with a TPU it spawns
the TPU cores with torch-xla's ``xmp.spawn`` instead, and in Colab without
several GPUs it runs ``fn`` in place. ``debug_launcher(fn, args, num_processes=2)``
forks CPU ranks over gloo for debugging, as HF 1.15: ``torch.multiprocessing``'s
``start_processes`` around ``PrepareForLaunch(fn, debug=True)``, the ranks
meeting in a file store (catalog ``launch.debug_launcher``).
A rank that raises ends a notebook launch with torch's ``ChildFailedError``
naming it, and a debug launch with torch's ``ProcessRaisedException`` (each
with that rank's traceback).
``fn`` may be any callable: a ``functools.partial`` or a callable object
too (HF's ``debug_launcher`` takes them; its ``notebook_launcher`` hands them
to torch's elastic agent, which fails on their missing ``__name__``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable

from .state import AcceleratorState, PartialState
from .utils.constants import ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION  # noqa: F401  (HF's launchers expose it)
from .utils.dataclasses import PrecisionType
from .utils.environment import (
    are_libraries_initialized,
    check_cuda_p2p_ib_support,
    get_current_device_type,
    get_gpu_info,
    patch_environment,
)
from .utils.imports import is_mps_available, is_rocm_available
from .utils.launch import LOOPBACK, PrepareForLaunch

REFUSAL = (
    "To launch a multi-device training from your notebook, the `Accelerator` should only be initialized "
    "inside your training function. Restart your notebook and make sure no cells initializes an "
    "`Accelerator`."
)
TPU_REFUSAL = (
    "To train on TPU in Colab or Kaggle Kernel, the `Accelerator` should only be initialized inside your "
    "training function. Restart your notebook and make sure no cells initializes an `Accelerator`."
)
#: Libraries that initialise a device when imported: imported before a forking launch, they are refused.
DEVICE_INITIALISING_LIBRARIES = ("bitsandbytes",)
#: What a fork-based launch finds checking its environment (ACCELERATE_DEBUG_MODE=true).
UNSTABLE_ENVIRONMENT = "An issue was found when verifying a stable environment for the notebook launcher."


def _state_exists() -> bool:
    """Whether an Accelerator was created in this process (its state is shared by every later one)."""
    return bool(AcceleratorState._shared_state)


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = LOOPBACK,
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked ranks per node (in place when 1).

    Rules, in HF 1.15's order: ``mixed_precision`` must be a PrecisionType (a
    ValueError naming it, where HF's own message fails: DIFFERENTIAL.toml); in
    Colab or a Kaggle kernel with a TPU (``TPU_NAME`` set or ``PJRT_DEVICE=TPU``)
    the TPU cores are spawned (refused once an Accelerator exists); in Colab
    without two GPUs ``function`` runs in place; otherwise
    ``num_processes`` must be given and ``node_rank < num_nodes``. With more than one
    process the launch is refused (RuntimeError) after an ``import bitsandbytes``,
    which initialises the device a fork would inherit, and (ValueError) once an
    Accelerator exists (catalog ``launch.notebook_launcher``); a rank that raises
    ends the launch with torch's ``ChildFailedError``. The rendezvous is torch's
    elastic one: ``rdzv_backend`` (``static``: this node's rank is ``node_rank`` and
    the endpoint defaults to ``master_addr:use_port``), ``rdzv_endpoint``,
    ``rdzv_conf`` and ``rdzv_id`` are passed to it as torchrun passes its options of
    those names; ``log_line_prefix_template`` prefixes each rank's log lines. The ranks
    see ``NPROC``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
    ``MIXED_PRECISION`` (HF's variable, which nothing reads) and
    ``ACCELERATE_MIXED_PRECISION``, which the ranks' Accelerator reads (HF 1.15 sets
    only the former: DIFFERENTIAL.toml) (and NCCL's P2P/IB switched off on GPUs that need
    it); XPU and ROCm machines spawn instead of forking. With
    ``ACCELERATE_DEBUG_MODE=true`` a first launch of ``test_launch`` checks that the
    ranks can start, a failure being a RuntimeError that says so.
    """
    try:
        precision = PrecisionType(mixed_precision.lower())
    except ValueError:
        raise ValueError(
            f"Unknown mixed_precision mode: {mixed_precision.lower()}. Choose between {PrecisionType.list()}."
        ) from None
    in_colab, in_kaggle = _notebook_host()
    if (in_colab or in_kaggle) and (os.environ.get("TPU_NAME") is not None or os.environ.get("PJRT_DEVICE", "") == "TPU"):
        _spawn_tpu_cores(function, args)
        return
    if in_colab and not _several_gpus():
        import torch

        print(f"Launching training on one {'GPU' if torch.cuda.is_available() else 'CPU'}.")
        function(*args)
        return
    if num_processes is None:
        raise ValueError(
            "You have to specify the number of devices you would like to use, add `num_processes=...` to your call."
        )
    if node_rank >= num_nodes:
        raise ValueError("The node_rank must be less than the number of nodes.")
    if num_processes == 1:
        print(f"Launching training on {_single_device()}.")
        function(*args)
        return
    if _state_exists():
        raise ValueError(REFUSAL)
    imported = are_libraries_initialized(*DEVICE_INITIALISING_LIBRARIES)
    if imported:
        raise RuntimeError(
            "Could not start distributed process. Libraries known to initialize device upon import have been "
            "imported already. Please keep these imports inside your training function to try and help with this:"
            + "".join(f"\n\t* `{name}`" for name in imported)
        )
    rdzv_conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        rdzv_conf["rank"] = node_rank
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    rendezvous = {"rdzv_backend": rdzv_backend, "rdzv_endpoint": rdzv_endpoint, "rdzv_configs": rdzv_conf, "run_id": rdzv_id}
    if log_line_prefix_template is not None:
        rendezvous["log_line_prefix_template"] = log_line_prefix_template
    env = {"nproc": num_processes, "node_rank": node_rank, "world_size": num_nodes * num_processes,
           "master_addr": master_addr, "master_port": use_port, "mixed_precision": precision.value,
           "accelerate_mixed_precision": precision.value}
    if not check_cuda_p2p_ib_support():
        env.update(nccl_p2p_disable="1", nccl_ib_disable="1")
    with patch_environment(**env):
        device_type, distributed_type = get_current_device_type()
        start_method = "spawn" if device_type == "xpu" or is_rocm_available() else "fork"
        if os.environ.get("ACCELERATE_DEBUG_MODE", "false").lower() == "true":
            _check_ranks_start(num_processes, device_type, distributed_type, start_method)
        print(f"Launching training on {num_processes} {device_type.upper()}s.")
        _fork_ranks(function, args, num_processes, num_nodes, rendezvous, max_restarts, monitor_interval, start_method)


def _notebook_host() -> tuple[bool, bool]:
    """``(in Colab, in a Kaggle kernel)``: Kaggle sets ``KAGGLE_*`` variables, Colab's IPython names google.colab."""
    if any(key.startswith("KAGGLE") for key in os.environ):
        return False, True
    ipython = sys.modules.get("IPython")
    return ipython is not None and "google.colab" in str(ipython.get_ipython()), False


def _several_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and get_gpu_info()[1] >= 2


def _spawn_tpu_cores(function: Callable[..., Any], args: tuple) -> None:
    """Colab's or Kaggle's TPU: every core runs ``function(*args)`` through torch-xla's ``xmp.spawn`` (forked)."""
    import torch_xla.distributed.xla_multiprocessing as xmp

    if _state_exists():
        raise ValueError(TPU_REFUSAL)
    launcher = PrepareForLaunch(function, distributed_type="XLA")
    print("Launching a training on TPU cores.")
    xmp.spawn(launcher, args=args, start_method="fork")


def _check_ranks_start(nproc: int, device_type: str, distributed_type: str, start_method: str) -> None:
    """Start ``nproc`` ranks that only build a ``PartialState`` (``test_launch``); a rank that fails is a RuntimeError.

    The usual failure, a device initialised before the fork, gets its own advice.
    """
    from torch.multiprocessing import start_processes
    from torch.multiprocessing.spawn import ProcessRaisedException

    try:
        start_processes(PrepareForLaunch(test_launch, distributed_type=distributed_type), args=(), nprocs=nproc,
                        start_method=start_method)
    except ProcessRaisedException as error:
        device = device_type.upper()
        if f"Cannot re-initialize {device} in forked subprocess" not in error.args[0]:
            raise RuntimeError(f"{UNSTABLE_ENVIRONMENT} The following error was raised: {error}") from error
        raise RuntimeError(
            f"{UNSTABLE_ENVIRONMENT}This likely stems from an outside import causing issues once the "
            "`notebook_launcher()` is called. Please review your imports and test them when running the "
            f"`notebook_launcher()` to identify which one is problematic and causing {device} to be initialized."
        ) from error


def _single_device() -> str:
    """What HF's launcher names the one device a single-process launch trains on."""
    import torch

    if is_mps_available():
        os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
        return "MPS"
    if torch.cuda.is_available():
        return "one GPU"
    if torch.xpu.is_available():
        return "one XPU"
    return "CPU"


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked CPU ranks (gloo on loopback) for debugging.

    Rule (HF 1.15): ``torch.multiprocessing.start_processes`` forks the ranks, each joining a gloo group
    over a temporary file store (``PrepareForLaunch(debug=True)``) with ``ACCELERATE_USE_CPU`` and no mixed
    precision; a rank that raises ends the launch with torch's ``ProcessRaisedException``.
    """
    from torch.multiprocessing import start_processes

    with tempfile.NamedTemporaryFile() as store, patch_environment(
        world_size=num_processes, master_addr=LOOPBACK, master_port="29500", accelerate_mixed_precision="no",
        accelerate_debug_rdv_file=store.name, accelerate_use_cpu="yes", gloo_socket_ifname="lo",
    ):
        start_processes(PrepareForLaunch(function, debug=True), args=args, nprocs=num_processes, start_method="fork")


def test_launch():
    """Check that a ``PartialState`` can be created here (what a launched script does first)."""
    _ = PartialState()


def _fork_ranks(function, args, nproc, num_nodes, rendezvous, max_restarts, monitor_interval, start_method) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=nproc,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method=start_method,
        **rendezvous,
    )
    with patch_environment(omp_num_threads=os.environ.get("OMP_NUM_THREADS", "1")):
        elastic_launch(config=config, entrypoint=_named(function))(*args)


def _named(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with a ``__name__``, which torch's elastic agent names the entrypoint by.

    A ``functools.partial`` or a callable object has none: it is called
    through a function named after what it wraps (its ``func``, else its class).
    """
    if hasattr(function, "__name__"):
        return function

    def entrypoint(*args: Any) -> Any:
        return function(*args)

    entrypoint.__name__ = getattr(getattr(function, "func", None), "__name__", type(function).__name__)
    return entrypoint
