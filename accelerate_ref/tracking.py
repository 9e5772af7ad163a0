"""Experiment tracking: trackers, and the `Accelerator` methods that drive them (a mixin).

``Accelerator(log_with=...)`` takes `LoggerType` members or their names,
``"all"``, names given to `register_tracker_class`, and `GeneralTracker`
instances. On the main process only, `init_trackers` creates and starts
them, `log` reaches every one, `end_training` finishes them; the other
processes create nothing and write nothing, so a metric logged by every
process is recorded once.

Built in, as in 🤗 Accelerate 1.15 (same names, constructors, methods,
refusals, warnings and DEBUG log lines): `TensorBoardTracker`
(``"tensorboard"``, when tensorboard or tensorboardX is installed),
`MLflowTracker` (``"mlflow"``, the ``mlflow`` or ``mlflow-skinny``
package) and `WandBTracker` (``"wandb"``), whose packages are in the
``trackers`` extra; and, from `_tracking.trackers` (extra ``trackers-more``),
`CometMLTracker`, `AimTracker`, `ClearMLTracker`, `DVCLiveTracker`,
`SwanLabTracker`, `TrackioTracker`. A tracker is created without its
package; starting it imports the package (a ModuleNotFoundError where it is
absent). Beyond 🤗 Accelerate: `JSONLinesTracker`, which needs no package;
register it (``register_tracker_class(JSONLinesTracker)``) to use it as
``log_with="jsonl"``.

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from typing import Any, Optional, Union

import yaml

from ._tracking.base import GeneralTracker, debug_started, installed_trackers, logger, on_main_process
from ._tracking.trackers import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)
from .utils.dataclasses import LoggerType
from .utils.environment import str_to_bool
from .utils.operations import listify
from .utils._other.serialization import write_atomically


def _plain(value: Any) -> Any:
    """A JSON-able stand-in for ``value``: a one-element tensor or numpy scalar as its number, else its str."""
    return value.item() if hasattr(value, "item") else str(value)


class JSONLinesTracker(GeneralTracker):
    """A tracker with no extra package: JSON lines in ``<logging_dir>/<run_name>/`` (not in 🤗 Accelerate;
    ``register_tracker_class(JSONLinesTracker)`` makes ``log_with="jsonl"`` use it).

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

    Rules: `start` creates the ``SummaryWriter`` (``kwargs`` of `__init__`
    go to it) and sets ``logging_dir`` (``logging_dir_param`` is the folder
    given); tensors in `log`'s values become numbers, then numbers are
    logged with ``add_scalar``, strings with ``add_text``, dicts of numbers
    with ``add_scalars`` (other values are skipped); the configuration goes
    to ``add_hparams`` and to ``<logging_dir>/<time>/hparams.yml``. Before
    `start` the tracker has no ``writer``. Main process only. Catalog:
    tracking.init_log_end.
    """

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Union[str, os.PathLike], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def start(self) -> None:
        try:
            from torch.utils import tensorboard
        except ModuleNotFoundError:
            import tensorboardX as tensorboard
        self.logging_dir = os.path.join(self.logging_dir_param, self.run_name)
        self.writer = tensorboard.SummaryWriter(self.logging_dir, **self.init_kwargs)
        debug_started("TensorBoard project", self.run_name, f" logging to {self.logging_dir}")

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.add_hparams(values, metric_dict={})
        self.writer.flush()
        folder = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "hparams.yml"), "w") as stream:
            try:
                yaml.dump(values, stream)
            except yaml.representer.RepresenterError:
                logger.error("Serialization to store hyperparameters failed")
                raise
        logger.debug("Stored initial configuration hyperparameters to TensorBoard and hparams yaml file")

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        for key, value in listify(values).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
        self.writer.flush()
        logger.debug("Successfully logged to TensorBoard")

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log each batch of images of ``values`` (``N x C x H x W`` arrays or tensors) with ``add_images``."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        logger.debug("Successfully logged images to TensorBoard")

    @on_main_process
    def finish(self) -> None:
        self.writer.close()
        logger.debug("TensorBoard writer closed")


class MLflowTracker(GeneralTracker):
    """MLflow, through the ``mlflow`` (or ``mlflow-skinny``) package, in the store of ``MLFLOW_TRACKING_URI``.

    Rules: the environment variables ``MLFLOW_EXPERIMENT_NAME``,
    ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (a JSON object) and
    ``MLFLOW_NESTED_RUN`` take precedence over the arguments of the same
    meaning. `start` uses the experiment of that name (the first when there
    are several, with a warning), creating it with ``logging_dir`` as its
    artifact location when there is none, and starts (or, with ``run_id``,
    resumes) a run there. `store_init_configuration` logs the configuration
    as parameters, 100 at a time, dropping a value longer than MLflow
    accepts with a warning; `log` logs the numbers of ``values`` as metrics
    at ``step`` (other values are dropped with a warning); `finish` ends the
    run. ``Accelerator.init_trackers`` passes the project name as
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

    @property
    def tracker(self) -> Any:
        """The active ``mlflow.ActiveRun`` (set by `start`)."""
        return self.active_run

    @on_main_process
    def start(self) -> None:
        import mlflow

        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if len(found) > 1:
            logger.warning("Multiple experiments with the same name found. Using first one.")
        if found:
            experiment_id = found[0].experiment_id
        else:
            experiment_id = mlflow.create_experiment(
                name=self.experiment_name, artifact_location=self.logging_dir, tags=self.tags
            )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )
        debug_started("mlflow experiment", self.experiment_name)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        kept = []
        for key, value in values.items():
            if len(str(value)) > MAX_PARAM_VAL_LENGTH:
                logger.warning_once(
                    f'Accelerate is attempting to log a value of "{value}" for key "{key}" as a parameter. MLflow\'s'
                    f" log_param() only accepts values no longer than {MAX_PARAM_VAL_LENGTH} characters so we dropped"
                    " this attribute."
                )
            else:
                kept.append((key, value))
        for first in range(0, len(kept), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(kept[first : first + MAX_PARAMS_TAGS_PER_BATCH]))
        logger.debug("Stored initial configuration hyperparameters to MLflow")

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log the numbers of ``values`` at ``step``; ``kwargs`` go to ``mlflow.log_metrics``."""
        metrics = {}
        for key, value in values.items():
            if isinstance(value, (int, float)):
                metrics[key] = value
            else:
                logger.warning_once(
                    f'MLflowTracker is attempting to log a value of "{value}" of type {type(value)} for key "{key}" as'
                    " a metric. MLflow's log_metric() only accepts float and int types so we dropped this attribute."
                )
        import mlflow

        mlflow.log_metrics(metrics, step=step, **kwargs)
        logger.debug("Successfully logged to mlflow")

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save ``figure`` (matplotlib or plotly) as the run's artifact ``artifact_file``."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)
        logger.debug("Successfully logged image to mlflow")

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: Optional[str] = None) -> None:
        """Copy every file of ``local_dir`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)
        logger.debug("Successfully logged artofact to mlflow")  # 🤗 Accelerate's spelling

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: Optional[str] = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts (under ``artifact_path``)."""
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)
        logger.debug("Successfully logged artofact to mlflow")  # 🤗 Accelerate's spelling

    @on_main_process
    def finish(self) -> None:
        import mlflow

        mlflow.end_run()


class WandBTracker(GeneralTracker):
    """Weights & Biases, through the ``wandb`` package (``WANDB_MODE=offline`` writes the run to local files only).

    Rules: `start` calls ``wandb.init(project=run_name, **kwargs)``;
    `store_init_configuration` updates ``wandb.config`` (changed values
    allowed; before `start`, wandb's own refusal); `log` is
    ``run.log(values, step=step, **kwargs)``; `log_images` logs each list of
    images as ``wandb.Image``s and `log_table` a ``wandb.Table``; `finish`
    finishes the run. As in 🤗 Accelerate its ``main_process_only`` is
    False: the methods run on any process that calls them, and
    ``Accelerator.init_trackers`` creates the tracker on the main process
    only. Catalog: tracking.init_log_end.
    """

    name = "wandb"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        """The ``wandb`` run (set by `start`)."""
        return self.run

    @on_main_process
    def start(self) -> None:
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)
        debug_started("WandB project", self.run_name)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import wandb

        wandb.config.update(values, allow_val_change=True)
        logger.debug("Stored initial configuration hyperparameters to WandB")

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self.run.log(values, step=step, **kwargs)
        logger.debug("Successfully logged to WandB")

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log each list of images of ``values`` (arrays or PIL images) as ``wandb.Image``s."""
        import wandb

        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)
        logger.debug("Successfully logged images to WandB")

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
        logger.debug("WandB run closed")


#: Tracker classes by name (the names ``log_with`` accepts besides "all"), in 🤗 Accelerate's order;
#: `register_tracker_class` adds to it.
LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    tracker_class.name: tracker_class
    for tracker_class in (AimTracker, CometMLTracker, MLflowTracker, TensorBoardTracker, WandBTracker,
                          ClearMLTracker, DVCLiveTracker, SwanLabTracker, TrackioTracker)
}


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose packages are installed, as `LoggerType` members (TensorBoard, W&B, Comet,
    Aim, MLflow, ClearML, DVCLive, SwanLab, Trackio, in that order). Catalog: tracking.init_log_end."""
    return installed_trackers()


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
        raise ValueError(
            "The tracker class to register must define a `requires_logging_directory` class attribute. "
            "Set it to `True` if the tracker needs a logging directory, or `False` otherwise."
        )
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"A tracker with the name '{tracker_class.name}' is already registered and will be overwritten by "
            f"{tracker_class}. This is especially significant when shadowing a built-in tracker."
        )
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def filter_trackers(
    log_with: Any, logging_dir: Optional[Union[str, os.PathLike]] = None
) -> list[Union[LoggerType, str, GeneralTracker]]:
    """The trackers ``log_with`` asks for that can run here.

    Rules: ``log_with`` is one item or a list (or tuple) of `LoggerType`
    members, their names, names given to `register_tracker_class`, and
    `GeneralTracker` instances. With ``"all"`` (or ``LoggerType.ALL``) among
    them: the instances given, then every installed built-in tracker.
    Otherwise, in order: an instance is kept (each time it is given); a
    built-in name becomes its `LoggerType` member, kept once, and only when
    its package is installed (else dropped, with a DEBUG log line); a
    registered name is kept once; anything else is a ValueError listing the
    `LoggerType` values. A tracker kept whose class writes files needs a
    ``logging_dir`` (ValueError). Catalog: tracking.init_log_end.
    """
    if log_with is None:
        return []
    items = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    if "all" in items or LoggerType.ALL in items:
        return [item for item in items if isinstance(item, GeneralTracker)] + get_available_trackers()
    chosen: list[Union[LoggerType, str, GeneralTracker]] = []
    for item in items:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        if item in LoggerType:
            member = LoggerType(item)
            if member in chosen:
                continue
            if member not in get_available_trackers():
                logger.debug(f"Tried adding logger {member}, but package is unavailable in the system.")
                continue
            item = member
        elif str(item) not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(f"Unsupported logging capability: {item}. Choose between {LoggerType.list()}")
        elif item in chosen:
            continue
        if LOGGER_TYPE_TO_CLASS[str(item)].requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with `{item}` requires a `logging_dir` to be passed in.")
        chosen.append(item)
    return chosen


class TrackingMixin:
    """`init_trackers`, `log`, `get_tracker`, `end_training` of the `Accelerator`.

    Uses the Accelerator's ``logging_dir``, ``is_main_process`` and
    ``state``. ``log_with`` is checked when it is set (by the Accelerator's
    constructor, after its project configuration), so a tracker that cannot
    run is reported when the Accelerator is created.
    """

    @property
    def log_with(self) -> list[Union[LoggerType, str, GeneralTracker]]:
        """The trackers asked for that can run here (see `filter_trackers`); when ``log_with`` was given and
        none can, a UserWarning says so. Catalog: tracking.init_log_end."""
        return self.__dict__.get("log_with", [])

    @log_with.setter
    def log_with(self, value: Any) -> None:
        trackers = filter_trackers(value, self.logging_dir)
        if not trackers and value is not None:
            warnings.warn(f"`log_with={value}` was passed but no supported trackers are currently installed.")
        self.__dict__["log_with"] = trackers

    @property
    def trackers(self) -> list[GeneralTracker]:
        """The started trackers (on the main process; empty elsewhere)."""
        return self.__dict__.setdefault("trackers", [])

    @trackers.setter
    def trackers(self, value: list[GeneralTracker]) -> None:
        self.__dict__["trackers"] = value

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
            tracker_class, options = LOGGER_TYPE_TO_CLASS[str(item)], init_kwargs.get(str(item), {})
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

        Rules: with trackers started, an unknown name is a ValueError;
        without any (the other processes, which start none), a do-nothing
        `GeneralTracker`. Catalog: tracking.init_log_end.
        """
        if not self.trackers:
            return GeneralTracker(_blank=True)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"{name} is not an available tracker stored inside the `Accelerator`.")

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
        """Finish every started tracker, then tear down the process group; call it at the end of a script.

        Catalog: tracking.init_log_end.
        """
        for tracker in self.trackers:
            tracker.finish()
        self.state.destroy_process_group()
