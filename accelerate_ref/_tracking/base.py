"""What every tracker shares: `GeneralTracker`, `on_main_process`, the trackers' logger, and which
built-in trackers' packages are installed.

`accelerate_ref.tracking` (the trackers with their offline tests in the
``trackers`` extra, and the Accelerator's tracking methods) and
`accelerate_ref._tracking.trackers` (the trackers of the ``trackers-more``
extra) build on it; both are reached as ``accelerate_ref.tracking``.

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

from ..logging import get_logger
from ..state import PartialState
from ..utils import imports
from ..utils.dataclasses import LoggerType

F = TypeVar("F", bound=Callable[..., Any])

#: The logger of every tracker (``accelerate_ref.tracking``, as 🤗 Accelerate's trackers log under its tracking module).
logger = get_logger("accelerate_ref.tracking")

#: The availability check (``imports.is_<name>_available``) of each built-in tracker's package, in the order
#: `get_available_trackers` lists them (🤗 Accelerate's).
_AVAILABILITY = {
    LoggerType.TENSORBOARD: "is_tensorboard_available",
    LoggerType.WANDB: "is_wandb_available",
    LoggerType.COMETML: "is_comet_ml_available",
    LoggerType.AIM: "is_aim_available",
    LoggerType.MLFLOW: "is_mlflow_available",
    LoggerType.CLEARML: "is_clearml_available",
    LoggerType.DVCLIVE: "is_dvclive_available",
    LoggerType.SWANLAB: "is_swanlab_available",
    LoggerType.TRACKIO: "is_trackio_available",
}


def installed_trackers() -> list[LoggerType]:
    """The built-in trackers whose packages are installed (checked when asked, without importing them)."""
    return [member for member, check in _AVAILABILITY.items() if getattr(imports, check)()]


def on_main_process(function: F) -> F:
    """Run a tracker method only on the main process when the tracker's ``main_process_only`` is true
    (an object without that attribute runs it everywhere); elsewhere the call does nothing and returns None.

    The check happens at each call, so decorating creates no process state. Catalog: tracking.init_log_end.
    """

    @functools.wraps(function)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not PartialState().is_main_process:
            return None
        return function(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class GeneralTracker:
    """Base class of every tracker; subclass it for a custom one and pass an instance in ``log_with``.

    Rules: a subclass defines ``name`` (``get_tracker`` finds it by it),
    ``requires_logging_directory`` and a ``tracker`` property (the
    underlying run or writer); missing ones are a NotImplementedError
    naming them when the tracker is created. ``start`` is called by
    `init_trackers`, then ``store_init_configuration(config)``, ``log(values,
    step, **kwargs)`` by `Accelerator.log`, ``finish`` by `end_training`.
    ``main_process_only`` (default True) keeps `on_main_process` methods to
    the main process. ``GeneralTracker(_blank=True)`` is the do-nothing
    tracker `get_tracker` returns on the other processes.
    Catalog: tracking.init_log_end.
    """

    main_process_only = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [attribute for attribute in ("name", "requires_logging_directory") if not hasattr(self, attribute)]
        missing += [] if "tracker" in dir(self) else ["tracker"]
        if missing:
            raise NotImplementedError(
                "The implementation for this tracker class is missing the following required attributes. "
                f"Please define them in the class definition: {', '.join(f'`{name}`' for name in missing)}"
            )

    def start(self) -> None:
        """Begin the run (called by `init_trackers`, after the process group exists)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyperparameters ``values``."""

    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``."""

    def finish(self) -> None:
        """End the run."""


def debug_started(kind: str, run_name: Any, where: str = "") -> None:
    """The two DEBUG lines a tracker logs when it starts (🤗 Accelerate's words)."""
    logger.debug(f"Initialized {kind} {run_name}{where}")
    logger.debug("Make sure to log any initial configurations with `self.store_init_configuration` before training!")
