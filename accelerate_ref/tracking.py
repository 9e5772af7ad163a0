"""Experiment tracking: trackers, and the `Accelerator` methods that drive them (a mixin).

``Accelerator(log_with=...)`` takes tracker names (`LoggerType` values,
``"all"``, or ``"jsonl"``) and `GeneralTracker` instances. On the main
process only, `init_trackers` creates and starts them, `log` reaches every
one, `end_training` finishes them; the other processes create nothing and
write nothing, so a metric logged by every process is recorded once.

Built in: `JSONLinesTracker` (``"jsonl"``, no extra package: one JSON
object per `log` call in ``<logging_dir>/<project>/log.jsonl``),
`TensorBoardTracker` (``"tensorboard"``, when tensorboard or tensorboardX
is installed), `MLflowTracker` (``"mlflow"``, the ``mlflow`` or
``mlflow-skinny`` package) and `WandBTracker` (``"wandb"``), whose
packages are in the ``trackers`` extra; and, from `tracking_more` (extra
``trackers-more``), `CometMLTracker`, `AimTracker`, `ClearMLTracker`,
`DVCLiveTracker`, `SwanLabTracker`, `TrackioTracker`. Any other
tracker is a `GeneralTracker` subclass passed in ``log_with``, or one
registered by name with `register_tracker_class`.

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Any, Optional, Union

from .logging import get_logger
from .tracking_base import _PACKAGES, GeneralTracker, _package_available, on_main_process
from .tracking_more import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)
from .utils.dataclasses import LoggerType
from .utils.environment import str_to_bool
from .utils.serialization import write_atomically

logger = get_logger(__name__)


def _plain(value: Any) -> Any:
    """A JSON-able stand-in for ``value``: a one-element tensor or numpy scalar as its number, else its str."""
    return value.item() if hasattr(value, "item") else str(value)


class JSONLinesTracker(GeneralTracker):
    """A tracker with no extra package: JSON lines in ``<logging_dir>/<run_name>/``.

    Rules: `start` creates the folder and opens ``log.jsonl`` for
    appending; `store_init_configuration` writes ``config.json``; each
    `log` appends ``{"step": step, "time": seconds, "values": values}`` and
    flushes (tensors and numpy scalars become numbers); `finish` closes.
    Main process only. Catalog: tracking.init_log_end.
    """

    name = "jsonl"
    requires_logging_directory = True
    LOG_NAME = "log.jsonl"
    CONFIG_NAME = "config.json"

    def __init__(self, run_name: str, logging_dir: Union[str, os.PathLike]) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self._stream: Any = None

    @property
    def tracker(self) -> Any:
        """The open ``log.jsonl`` stream (None before `start` and after `finish`)."""
        return self._stream

    @on_main_process
    def start(self) -> None:
        os.makedirs(self.logging_dir, exist_ok=True)
        self._stream = open(os.path.join(self.logging_dir, self.LOG_NAME), "a", encoding="utf-8")

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        payload = json.dumps(values, indent=2, default=_plain).encode()
        write_atomically(os.path.join(self.logging_dir, self.CONFIG_NAME), lambda stream: stream.write(payload))

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        self._stream.write(json.dumps({"step": step, "time": time.time(), "values": values}, default=_plain) + "\n")
        self._stream.flush()

    @on_main_process
    def finish(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class TensorBoardTracker(GeneralTracker):
    """TensorBoard, through ``torch.utils.tensorboard`` (or tensorboardX): events in ``<logging_dir>/<run_name>``.

    Rules: numbers are logged with ``add_scalar``, strings with
    ``add_text``, dicts of numbers with ``add_scalars``; the configuration
    with ``add_hparams``; ``kwargs`` of `__init__` go to ``SummaryWriter``.
    Main process only. Catalog: tracking.init_log_end.
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Union[str, os.PathLike], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.init_kwargs = kwargs
        self.writer: Any = None

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def start(self) -> None:
        try:
            from torch.utils import tensorboard
        except ModuleNotFoundError:
            import tensorboardX as tensorboard
        self.writer = tensorboard.SummaryWriter(self.logging_dir, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.add_hparams(values, metric_dict={})
        self.writer.flush()

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log each batch of images of ``values`` (``N x C x H x W`` arrays or tensors) with ``add_images``."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.writer.close()


class MLflowTracker(GeneralTracker):
    """MLflow, through the ``mlflow`` (or ``mlflow-skinny``) package, in the store of ``MLFLOW_TRACKING_URI``.

    Rules: the environment variables ``MLFLOW_EXPERIMENT_NAME``,
    ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (a JSON object) and
    ``MLFLOW_NESTED_RUN`` take precedence over the arguments of the same
    meaning. `start` uses the experiment of that name (the first when there
    are several), creating it with ``logging_dir`` as its artifact location
    when there is none, and starts (or, with ``run_id``, resumes) a run
    there. `store_init_configuration` logs the configuration as parameters,
    100 at a time, dropping a value longer than MLflow accepts with a
    warning; `log` logs the numbers of ``values`` as metrics at ``step``
    (other values are dropped with a warning); `finish` ends the run.
    ``Accelerator.init_trackers`` passes the project name as
    ``experiment_name``. Main process only. Catalog: tracking.init_log_end.
    """

    name = "mlflow"
    requires_logging_directory = False

    def __init__(
        self,
        experiment_name: Optional[str] = None,
        logging_dir: Optional[Union[str, os.PathLike]] = None,
        run_id: Optional[str] = None,
        tags: Optional[Union[dict[str, Any], str]] = None,
        nested_run: Optional[bool] = False,
        run_name: Optional[str] = None,
        description: Optional[str] = None,
    ) -> None:
        super().__init__()
        tags = os.environ.get("MLFLOW_TAGS", tags)
        nested_run = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = str_to_bool(nested_run) == 1 if isinstance(nested_run, str) else nested_run
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None

    @property
    def tracker(self) -> Any:
        """The active ``mlflow.ActiveRun`` (None before `start`)."""
        return self.active_run

    @on_main_process
    def start(self) -> None:
        import mlflow

        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if len(found) > 1:
            logger.warning(f"several MLflow experiments are called {self.experiment_name!r}; using the first")
        if found:
            experiment_id = found[0].experiment_id
        else:
            location = None if self.logging_dir is None else os.fspath(self.logging_dir)
            experiment_id = mlflow.create_experiment(self.experiment_name, artifact_location=location, tags=self.tags)
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        kept = []
        for key, value in values.items():
            if len(str(value)) > MAX_PARAM_VAL_LENGTH:
                logger.warning_once(
                    f"MLflow takes parameter values of at most {MAX_PARAM_VAL_LENGTH} characters: {key!r} dropped"
                )
            else:
                kept.append((key, value))
        for first in range(0, len(kept), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(kept[first : first + MAX_PARAMS_TAGS_PER_BATCH]))

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log the numbers of ``values`` at ``step``; ``kwargs`` go to ``mlflow.log_metrics``."""
        import mlflow

        metrics = {}
        for key, value in values.items():
            if isinstance(value, (int, float)):
                metrics[key] = value
            else:
                logger.warning_once(
                    f"MLflow metrics are numbers: {key!r} ({type(value).__name__}) dropped from MLflowTracker.log"
                )
        mlflow.log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save ``figure`` (matplotlib or plotly) as the run's artifact ``artifact_file``."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: Optional[str] = None) -> None:
        """Copy every file of ``local_dir`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        import mlflow

        mlflow.end_run()


class WandBTracker(GeneralTracker):
    """Weights & Biases, through the ``wandb`` package (``WANDB_MODE=offline`` writes the run to local files only).

    Rules: `start` calls ``wandb.init(project=run_name, **kwargs)``;
    `store_init_configuration` updates the run's config (changed values
    allowed); `log` is ``run.log(values, step=step, **kwargs)``;
    `log_images` logs each list of images as ``wandb.Image``s and
    `log_table` a ``wandb.Table``; `finish` finishes the run. As in 🤗
    Accelerate its ``main_process_only`` is False: the methods run on any
    process that calls them, and ``Accelerator.init_trackers`` creates the
    tracker on the main process only. Catalog: tracking.init_log_end.
    """

    name = "wandb"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run (None before `start`)."""
        return self.run

    @on_main_process
    def start(self) -> None:
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log each list of images of ``values`` (arrays or PIL images) as ``wandb.Image``s."""
        import wandb

        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: Optional[list[str]] = None,
        data: Optional[list[list[Any]]] = None,
        dataframe: Any = None,
        step: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        """Log a ``wandb.Table`` called ``table_name``, from ``columns`` and ``data`` or from ``dataframe``."""
        import wandb

        self.log({table_name: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()


#: Tracker classes by name (the names ``log_with`` accepts besides "all"); `register_tracker_class` adds to it.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    JSONLinesTracker.name: JSONLinesTracker,
    TensorBoardTracker.name: TensorBoardTracker,
    MLflowTracker.name: MLflowTracker,
    WandBTracker.name: WandBTracker,
    # the trackers of the trackers-more extra (accelerate_ref.tracking_more)
    AimTracker.name: AimTracker,
    CometMLTracker.name: CometMLTracker,
    ClearMLTracker.name: ClearMLTracker,
    DVCLiveTracker.name: DVCLiveTracker,
    SwanLabTracker.name: SwanLabTracker,
    TrackioTracker.name: TrackioTracker,
}
#: The names of LOGGER_TYPE_TO_CLASS that come with this reference (the others were registered).
_BUILT_IN = tuple(LOGGER_TYPE_TO_CLASS)


def get_available_trackers() -> list[str]:
    """Names of the built-in trackers usable here: "jsonl", then each one whose package is installed.

    Catalog: tracking.init_log_end.
    """
    return [name for name in _BUILT_IN if name not in LoggerType.list() or _package_available(name)]


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make ``tracker_class`` usable by its ``name`` in ``log_with``, as the built-in trackers are.

    Rules: it must be a `GeneralTracker` subclass with a non-empty ``name``
    and a ``requires_logging_directory`` (ValueError otherwise); a name
    already registered is replaced, with a warning. `init_trackers` creates
    it as ``tracker_class(project_name[, logging_dir], **init_kwargs[name])``.
    Register before creating the Accelerator. Catalog: tracking.init_log_end.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"`tracker_class` must be a subclass of `GeneralTracker`, but got {tracker_class}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError("The tracker class to register must define a `requires_logging_directory` class attribute.")
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"a tracker called {tracker_class.name!r} is already registered; {tracker_class} replaces it")
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def _tracker_name(item: Any) -> Optional[str]:
    """The tracker name ``item`` stands for, or None when it names nothing this reference knows."""
    name = item.value if isinstance(item, LoggerType) else str(item)
    return name if name in LOGGER_TYPE_TO_CLASS or name in LoggerType.list() else None


def filter_trackers(
    log_with: Any, logging_dir: Optional[Union[str, os.PathLike]] = None
) -> list[Union[str, GeneralTracker]]:
    """The trackers ``log_with`` asks for: `GeneralTracker` instances and tracker names, without repeats.

    Rules: ``log_with`` is one item or a list of `LoggerType` members, their
    names (``"mlflow"``, ``"wandb"``, ...), names given to
    `register_tracker_class`, and `GeneralTracker` instances; ``"all"`` adds every
    available built-in tracker; a name of a tracker whose package is not
    installed is dropped with a warning (as a script that lists several
    trackers expects); a built-in tracker that writes files needs a
    ``logging_dir`` (ValueError); anything else a ValueError listing the
    choices.
    Catalog: tracking.init_log_end.
    """
    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    chosen: list[Union[str, GeneralTracker]] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            chosen += [] if any(item is known for known in chosen) else [item]
            continue
        name = _tracker_name(item)
        if name is None:
            known = LoggerType.list() + [name for name in LOGGER_TYPE_TO_CLASS if name not in LoggerType.list()]
            raise ValueError(f"Unsupported logging capability: {item}. Choose between {known}")  # HF's words
        for candidate in get_available_trackers() if name == LoggerType.ALL.value else [name]:
            if candidate not in chosen and _usable(candidate, logging_dir):
                chosen.append(candidate)
    return chosen


def _usable(name: str, logging_dir: Optional[Union[str, os.PathLike]]) -> bool:
    """Whether tracker ``name`` can run here (see `filter_trackers` for the errors)."""
    if name in LoggerType.list() and not _package_available(name):
        warnings.warn(f"log_with asks for {name}, but {_PACKAGES[LoggerType(name)][0]} is not installed: not tracking with it")
        return False
    if LOGGER_TYPE_TO_CLASS[name].requires_logging_directory and logging_dir is None:
        raise ValueError(f"tracking with {name} needs a logging_dir (ProjectConfiguration(logging_dir=...) or project_dir)")
    return True


class TrackingMixin:
    """`init_trackers`, `log`, `get_tracker`, `end_training` of the `Accelerator`.

    Uses the Accelerator's ``logging_dir``, ``is_main_process`` and
    ``state``. ``log_with`` is checked when it is set (by the Accelerator's
    constructor, after its project configuration), so a tracker that cannot
    run is reported when the Accelerator is created.
    """

    @property
    def log_with(self) -> list[Union[str, GeneralTracker]]:
        """The trackers asked for, checked (see `filter_trackers`). Catalog: tracking.init_log_end."""
        return self.__dict__.get("log_with", [])

    @log_with.setter
    def log_with(self, value: Any) -> None:
        self.__dict__["log_with"] = filter_trackers(value, self.logging_dir)

    @property
    def trackers(self) -> list[GeneralTracker]:
        """The started trackers (on the main process; empty elsewhere)."""
        return self.__dict__.setdefault("trackers", [])

    def init_trackers(self, project_name: str, config: Optional[dict[str, Any]] = None, init_kwargs: Optional[dict[str, dict[str, Any]]] = None) -> None:
        """On the main process, create and start every tracker of ``log_with`` for ``project_name``.

        Rules: a name becomes its tracker class's instance (created with
        ``project_name``, the ``logging_dir`` where it writes files, and
        ``init_kwargs[name]``); a `GeneralTracker` instance is used as is;
        each is started, then given ``config`` with
        ``store_init_configuration``. The other processes do nothing.
        Catalog: tracking.init_log_end.
        """
        if not self.is_main_process:
            return
        init_kwargs = init_kwargs or {}
        for item in self.log_with:
            if isinstance(item, GeneralTracker):
                self.trackers.append(item)
                continue
            tracker_class, options = LOGGER_TYPE_TO_CLASS[item], init_kwargs.get(item, {})
            if tracker_class.requires_logging_directory:
                self.trackers.append(tracker_class(project_name, self.logging_dir, **options))
            else:
                self.trackers.append(tracker_class(project_name, **options))
        for tracker in self.trackers:
            tracker.start()
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The started tracker called ``name`` (its ``tracker`` object with ``unwrap=True``).

        Rules: on the main process an unknown name is a ValueError; on the
        others, which start no tracker, a do-nothing `GeneralTracker`.
        Catalog: tracking.init_log_end.
        """
        if not self.trackers:
            return GeneralTracker(_blank=True)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"no started tracker is called {name!r}; started: {[t.name for t in self.trackers]}")

    def log(self, values: dict[str, Any], step: Optional[int] = None, log_kwargs: Optional[dict[str, dict[str, Any]]] = None) -> None:
        """Log ``values`` at ``step`` to every started tracker, on the main process only.

        ``log_kwargs[tracker name]`` go to that tracker's ``log``.
        Catalog: tracking.init_log_end.
        """
        if not self.is_main_process:
            return
        for tracker in self.trackers:
            tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish every tracker (main process), then tear down the process group; call it at the end of a script.

        Catalog: tracking.init_log_end.
        """
        if self.is_main_process:
            for tracker in self.trackers:
                tracker.finish()
        self.state.destroy_process_group()
