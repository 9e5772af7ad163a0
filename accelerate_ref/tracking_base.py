"""What every tracker shares: `GeneralTracker`, `on_main_process`, and the package each built-in tracker needs.

`accelerate_ref.tracking` (the trackers with their offline tests in the
``trackers`` extra, and the Accelerator's tracking methods) and
`accelerate_ref.tracking_more` (the trackers of the ``trackers-more``
extra) build on it; both are reached as ``accelerate_ref.tracking``.

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, TypeVar

from .state import PartialState
from .utils import imports
from .utils.dataclasses import LoggerType

F = TypeVar("F", bound=Callable[..., Any])


#: The package each `LoggerType` needs and the check that finds it (``imports.is_<name>_available``).
_PACKAGES = {
    LoggerType.AIM: ("aim", "is_aim_available"),
    LoggerType.TENSORBOARD: ("tensorboard", "is_tensorboard_available"),
    LoggerType.WANDB: ("wandb", "is_wandb_available"),
    LoggerType.TRACKIO: ("trackio", "is_trackio_available"),
    LoggerType.COMETML: ("comet_ml", "is_comet_ml_available"),
    LoggerType.MLFLOW: ("mlflow", "is_mlflow_available"),
    LoggerType.CLEARML: ("clearml", "is_clearml_available"),
    LoggerType.DVCLIVE: ("dvclive", "is_dvclive_available"),
    LoggerType.SWANLAB: ("swanlab", "is_swanlab_available"),
}


def _package_available(name: str) -> bool:
    """Whether the package of the built-in tracker ``name`` is installed (checked when asked, not at import)."""
    return getattr(imports, _PACKAGES[LoggerType(name)][1])()


def on_main_process(function: F) -> F:
    """Run a tracker method only on the main process when the tracker's ``main_process_only`` is true.

    Catalog: tracking.init_log_end.
    """

    @functools.wraps(function)
    def run(self: "GeneralTracker", *args: Any, **kwargs: Any) -> Any:
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
                f"{type(self).__name__} is missing the tracker attributes {', '.join(missing)}; define them in the class"
            )

    def start(self) -> None:
        """Begin the run (called by `init_trackers`, after the process group exists)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyperparameters ``values``."""

    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``."""

    def finish(self) -> None:
        """End the run."""



def require_package(tracker_name: str) -> None:
    """Refuse to create the built-in tracker ``tracker_name`` when its package is not installed.

    Rule: a ModuleNotFoundError naming the package (and the extra that
    installs it), raised when the tracker is created, not when it starts.
    The check does not import the package. Catalog: tracking.init_log_end.
    """
    if not _package_available(tracker_name):
        package = _PACKAGES[LoggerType(tracker_name)][0]
        raise ModuleNotFoundError(
            f"the {tracker_name} tracker needs the {package} package, which is not installed "
            f"(pip install {package}, or accelerate-ref[trackers-more])",
            name=package,
        )
