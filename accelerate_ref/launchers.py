"""``notebook_launcher`` and ``debug_launcher``: several ranks from one Python process.

``notebook_launcher(fn, args, num_processes=N)`` forks N ranks with torch's
elastic agent (``torch.distributed.launcher.api.elastic_launch``, start method
``fork``, as documented for notebooks); each runs ``fn(*args)`` as one rank of
a torchrun-style world. The ``Accelerator`` must be created inside ``fn``: one
created before the call is refused with a ``ValueError`` saying so (catalog
``launch.notebook_launcher``). ``debug_launcher(fn, args, num_processes=2)``
forks CPU ranks over gloo for debugging (catalog ``launch.debug_launcher``).
A rank that raises ends the launch with torch's ``ChildFailedError`` naming it.
``fn`` may be any callable: a ``functools.partial`` or a callable object
too (HF's ``debug_launcher`` takes them; its ``notebook_launcher`` hands them
to torch's elastic agent, which fails on their missing ``__name__``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .state import AcceleratorState, PartialState
from .utils.constants import ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION  # noqa: F401  (HF's launchers expose it)
from .utils.dataclasses import PrecisionType
from .utils.environment import are_libraries_initialized, get_current_device_type, patch_environment
from .utils.imports import is_mps_available
from .utils.launch import LOOPBACK
from .utils.ports import get_free_port

REFUSAL = (
    "To launch a multi-device training from your notebook, the `Accelerator` should only be initialized "
    "inside your training function. Restart your notebook and make sure no cells initializes an "
    "`Accelerator`."
)
#: Libraries that initialise a device when imported: imported before a forking launch, they are refused.
DEVICE_INITIALISING_LIBRARIES = ("bitsandbytes",)


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

    Rules, in HF 1.15's order: ``mixed_precision`` must be a PrecisionType;
    ``num_processes`` must be given; ``node_rank < num_nodes``. With more than one
    process the launch is refused (RuntimeError) after an ``import bitsandbytes``,
    which initialises the device a fork would inherit, and (ValueError) once an
    Accelerator exists (catalog ``launch.notebook_launcher``); a rank that raises
    ends the launch with torch's ``ChildFailedError``. The rendezvous is torch's
    elastic one: ``rdzv_backend`` (``static``: this node's rank is ``node_rank`` and
    the endpoint defaults to ``master_addr:use_port``), ``rdzv_endpoint``,
    ``rdzv_conf`` and ``rdzv_id`` are passed to it as torchrun passes its options of
    those names; ``log_line_prefix_template`` prefixes each rank's log lines.
    """
    if mixed_precision.lower() not in PrecisionType.list():
        raise ValueError(f"Unknown mixed_precision mode: {mixed_precision.lower()}. Choose between {PrecisionType.list()}.")
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
    print(f"Launching training on {num_processes} {get_current_device_type()[0].upper()}s.")
    _fork_ranks(function, args, num_processes, num_nodes, rendezvous, max_restarts, monitor_interval,
                accelerate_mixed_precision=mixed_precision)


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
    """Run ``function(*args)`` on ``num_processes`` forked CPU ranks (gloo on loopback) for debugging."""
    rendezvous = {"rdzv_backend": "static", "rdzv_endpoint": f"{LOOPBACK}:{get_free_port()}", "rdzv_configs": {"rank": 0},
                  "run_id": "accelerate_ref_debug"}
    _fork_ranks(function, args, num_processes, 1, rendezvous, 0, 0.1, accelerate_mixed_precision="no", accelerate_use_cpu="True")


def test_launch():
    """Check that a ``PartialState`` can be created here (what a launched script does first)."""
    _ = PartialState()


def _fork_ranks(function, args, nproc, num_nodes, rendezvous, max_restarts, monitor_interval, **env) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=nproc,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        **rendezvous,
    )
    with patch_environment(omp_num_threads=os.environ.get("OMP_NUM_THREADS", "1"), **env):
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
