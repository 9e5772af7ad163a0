"""``notebook_launcher`` and ``debug_launcher``: several ranks from one Python process.

``notebook_launcher(fn, args, num_processes=N)`` forks N ranks with torch's
elastic agent (``torch.distributed.launcher.api.elastic_launch``, start method
``fork``, as documented for notebooks); each runs ``fn(*args)`` as one rank of
a torchrun-style world. The ``Accelerator`` must be created inside ``fn``: one
created before the call is refused with a ``ValueError`` saying so (catalog
``launch.notebook_launcher``). ``debug_launcher(fn, args, num_processes=2)``
forks CPU ranks over gloo for debugging (catalog ``launch.debug_launcher``).
A rank that raises ends the launch with a ``RuntimeError`` naming it.
``fn`` may be any callable: a ``functools.partial`` or a callable object
too (HF's ``debug_launcher`` takes them; its ``notebook_launcher`` hands them
to torch's elastic agent, which fails on their missing ``__name__``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from .state import AcceleratorState, PartialState
from .utils.constants import ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION  # noqa: F401  (HF's launchers expose it)
from .utils.environment import patch_environment
from .utils.launch import LOOPBACK
from .utils.ports import get_free_port

REFUSAL = (
    "an Accelerator (or PartialState) was created before notebook_launcher was called: create the "
    "Accelerator only inside the training function, restart the notebook and run the launcher first"
)


def _state_exists() -> bool:
    return bool(PartialState._shared_state) or bool(AcceleratorState._shared_state)


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
    """Run ``function(*args)`` on ``num_processes`` forked ranks per node (one process in place when 1 or None).

    The rendezvous is torch's elastic one: ``rdzv_backend`` (``static``: this node's rank is
    ``node_rank`` and the endpoint defaults to ``master_addr:use_port``), ``rdzv_endpoint``,
    ``rdzv_conf`` and ``rdzv_id`` are passed to it as torchrun passes its options of those names;
    ``log_line_prefix_template`` prefixes each rank's log lines (torch >= 2.2).
    """
    if _state_exists():
        raise ValueError(REFUSAL)
    if not num_processes or num_processes == 1:
        with patch_environment(accelerate_mixed_precision=mixed_precision):
            function(*args)
        return
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f"node_rank {node_rank} must be in [0, num_nodes={num_nodes})")
    rdzv_conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        rdzv_conf["rank"] = node_rank
        rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
    rendezvous = {"rdzv_backend": rdzv_backend, "rdzv_endpoint": rdzv_endpoint, "rdzv_configs": rdzv_conf, "run_id": rdzv_id}
    if log_line_prefix_template is not None:
        rendezvous["log_line_prefix_template"] = log_line_prefix_template
    _fork_ranks(function, args, num_processes, num_nodes, rendezvous, max_restarts, monitor_interval,
                accelerate_mixed_precision=mixed_precision)


def debug_launcher(function: Callable[..., Any], args: tuple = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` on ``num_processes`` forked CPU ranks (gloo on loopback) for debugging."""
    rendezvous = {"rdzv_backend": "static", "rdzv_endpoint": f"{LOOPBACK}:{get_free_port()}", "rdzv_configs": {"rank": 0},
                  "run_id": "accelerate_ref_debug"}
    _fork_ranks(function, args, num_processes, 1, rendezvous, 0, 0.1, accelerate_mixed_precision="no", accelerate_use_cpu="True")


def test_launch():
    """Check that a ``PartialState`` can be created here (what a launched script does first)."""
    _ = PartialState()


def _fork_ranks(function, args, nproc, num_nodes, rendezvous, max_restarts, monitor_interval, **env) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
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
        try:
            elastic_launch(config=config, entrypoint=_named(function))(*args)
        except ChildFailedError as error:
            rank, failure = error.get_first_failure()
            raise RuntimeError(f"rank {rank} of the launch failed: {failure.message or failure.exitcode}") from None


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
