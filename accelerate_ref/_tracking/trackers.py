"""The trackers of the ``trackers-more`` extra: Comet, Aim, ClearML, DVCLive, SwanLab, Trackio.

Each is a `GeneralTracker` over its own package, with the name, the
constructor, the methods, the warnings and DEBUG log lines of 🤗 Accelerate
1.15's class of the same name (reached as ``accelerate_ref.tracking.<Class>``).
Each is created without its package and imports it when it starts (a
ModuleNotFoundError where it is absent); before `start` it has no run, so
the methods that use one raise AttributeError, as 🤗 Accelerate's do.
Unless noted, the methods run on the main process only.

Offline use (how the tests read the stores back): Comet with
``init_kwargs={"comet_ml": {"online": False}}`` writes a zip archive to its
offline directory; Aim writes its repository under the logging directory;
ClearML in offline mode (``CLEARML_OFFLINE_MODE=1``) writes a session folder
and zip; DVCLive writes files under ``dir``; SwanLab has ``mode="offline"``
and Trackio a local database.

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional, Union

from .base import GeneralTracker, debug_started, logger, on_main_process
from ..utils.versions import compare_versions


def _drop_non_scalar(verb: str, key: str, value: Any, call: str) -> None:
    """Warn (once per message) that ``value`` of ``key`` is not a scalar ``call`` records, and is dropped."""
    logger.warning_once(
        f'Accelerator {verb} a value of "{value}" of type {type(value)} for key "{key}" as a scalar. '
        f"This invocation of {call} is incorrect so we dropped this attribute."
    )


class CometMLTracker(GeneralTracker):
    """Comet, through the ``comet_ml`` package (API keys in Comet's own configuration, or offline).

    Rules: `start` is ``comet_ml.start(project_name=run_name, **kwargs)``
    (``comet_ml.Experiment`` before comet_ml 3.41); `store_init_configuration`
    logs parameters; `log` sets the experiment's step, then logs numbers with
    ``log_metric``, strings with ``log_other`` and dicts with ``log_metrics``;
    `finish` ends the experiment. Catalog: tracking.init_log_end.
    """

    name = "comet_ml"
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        """The Comet experiment (set by `start`)."""
        return self.writer

    @on_main_process
    def start(self) -> None:
        import comet_ml

        if compare_versions("comet_ml", ">=", "3.41.0"):
            self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)
        else:
            logger.info("Update `comet_ml` (>=3.41.0) for experiment reuse and offline support.")
            self.writer = comet_ml.Experiment(project_name=self.run_name, **self.init_kwargs)
        debug_started("CometML project", self.run_name)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log_parameters(values)
        logger.debug("Stored initial configuration hyperparameters to Comet")

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Numbers as metrics at ``step``, strings as "other" values, dicts as several metrics."""
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)
        logger.debug("Successfully logged to Comet")

    @on_main_process
    def finish(self) -> None:
        self.writer.end()
        logger.debug("Comet run flushed")


class AimTracker(GeneralTracker):
    """Aim, through the ``aim`` package: a run in the Aim repository at ``logging_dir``.

    Rules: `start` opens ``aim.Run(repo=logging_dir, **kwargs)`` and names
    it ``run_name``; `store_init_configuration` sets the run's ``hparams``;
    `log` tracks each value under its key at ``step``; `log_images` tracks
    ``aim.Image``s (a value may be ``(image, caption)``; ``kwargs["aim_image"]``
    and ``kwargs["track"]`` go to ``aim.Image`` and ``Run.track``); `finish`
    closes the run. Catalog: tracking.init_log_end.
    """

    name = "aim"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: Optional[Union[str, os.PathLike]] = ".", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = logging_dir
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        """The ``aim.Run`` (set by `start`)."""
        return self.writer

    @on_main_process
    def start(self) -> None:
        from aim import Run

        self.writer = Run(repo=self.aim_repo_path, **self.init_kwargs)
        self.writer.name = self.run_name
        debug_started("Aim project", self.run_name)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer["hparams"] = values

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """``Run.track(value, name=key, step=step, **kwargs)`` for each item."""
        for key, value in values.items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, kwargs: Optional[dict[str, dict]] = None) -> None:
        """Track each image of ``values`` (an array or PIL image, or ``(image, caption)``) as an ``aim.Image``."""
        import aim

        image_kwargs = (kwargs or {}).get("aim_image", {})
        track_kwargs = (kwargs or {}).get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(aim.Image(image, caption=caption, **image_kwargs), name=key, step=step, **track_kwargs)

    @on_main_process
    def finish(self) -> None:
        self.writer.close()


class ClearMLTracker(GeneralTracker):
    """ClearML, through the ``clearml`` package: a Task (``CLEARML_OFFLINE_MODE=1`` keeps it local).

    Rules: `start` uses the task already running in the process if there is
    one (and `finish` then leaves it open), else ``Task.init`` with
    ``project_name`` and ``task_name`` from ``CLEARML_PROJECT`` /
    ``CLEARML_TASK``, or ``run_name`` (``kwargs`` go to ``Task.init`` and
    win); `store_init_configuration` connects the configuration; `log`
    reports numbers: with a ``step`` as scalars (a key ``eval_x``,
    ``test_x`` or ``train_x`` is title ``x`` in series eval/test/train, any
    other key is its own title in series train), without one as single
    values; other values are dropped with a warning. Catalog:
    tracking.init_log_end.
    """

    name = "clearml"
    requires_logging_directory = False

    def __init__(self, run_name: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__()
        self.user_provided_run_name = run_name
        self._initialized_externally = False
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        """The ClearML ``Task`` (set by `start`)."""
        return self.task

    @on_main_process
    def start(self) -> None:
        from clearml import Task

        current = Task.current_task()
        if current:
            self._initialized_externally, self.task = True, current
            return
        arguments = dict(self.init_kwargs)
        arguments.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.user_provided_run_name))
        arguments.setdefault("task_name", os.environ.get("CLEARML_TASK", self.user_provided_run_name))
        self.task = Task.init(**arguments)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> Any:
        return self.task.connect_configuration(values)

    @on_main_process
    def log(self, values: dict[str, Union[int, float]], step: Optional[int] = None, **kwargs: Any) -> None:
        """Report numbers (scalars at ``step``, or single values without one; see the class rules)."""
        clearml_logger = self.task.get_logger()
        for key, value in values.items():
            if not isinstance(value, (int, float)):
                _drop_non_scalar("is attempting to log", key, value, "ClearML logger's  report_scalar()")
            elif step is None:
                clearml_logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = self._get_title_series(key)
                clearml_logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """``Logger.report_image`` for each image of ``values``, titled as `log` titles its keys."""
        clearml_logger = self.task.get_logger()
        for key, image in values.items():
            title, series = self._get_title_series(key)
            clearml_logger.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

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
        """Report a table: ``dataframe``, or ``data`` under a header row ``columns`` (one of them is required)."""
        table = dataframe
        if dataframe is None:
            if data is None:
                raise ValueError("`ClearMLTracker.log_table` requires that `data` to be supplied if `dataframe` is `None`")
            table = [columns] + data if columns else data
        title, series = self._get_title_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        """Close the task, unless it was started outside this tracker."""
        if self.task and not self._initialized_externally:
            self.task.close()

    @staticmethod
    def _get_title_series(name: str) -> tuple[str, str]:
        for prefix in ("eval", "test", "train"):
            if name.startswith(prefix + "_"):
                return name[len(prefix) + 1 :], prefix
        return name, "train"


class DVCLiveTracker(GeneralTracker):
    """DVCLive, through the ``dvclive`` package: ``dvclive.Live(**kwargs)`` (or the ``live`` given), files under its ``dir``.

    Rules: ``run_name`` is ignored; `store_init_configuration` is
    ``Live.log_params``; `log` sets the step (when given), logs each value
    DVCLive can record as a metric (others dropped with a warning), then
    ``Live.next_step()``; `finish` is ``Live.end()``. Catalog:
    tracking.init_log_end.

    Note: DVCLive itself (not this class) runs ``dvc init`` in the Git
    repository around the working directory when it finds no DVC repository
    there; ``save_dvc_exp=False, dvcyaml=None`` keep it from writing
    ``dvc.yaml`` and experiments.
    """

    name = "dvclive"
    requires_logging_directory = False

    def __init__(self, run_name: Optional[str] = None, live: Optional[Any] = None, **kwargs: Any) -> None:
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        """The ``dvclive.Live`` (None before `start` unless one was given)."""
        return self.live

    @on_main_process
    def start(self) -> None:
        from dvclive import Live

        self.live = self.live if self.live is not None else Live(**self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.live.log_params(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """``Live.log_metric`` for each value it can record, at ``step``; then the next step."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in values.items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                _drop_non_scalar("attempted to log", key, value, "DVCLive's Live.log_metric()")
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        self.live.end()


class _PackageRunTracker(GeneralTracker):
    """A run that the package ``name`` starts with ``<name>.init(project=run_name, **kwargs)`` and
    configures through ``<name>.config`` (SwanLab, Trackio); ``label`` names it in the DEBUG log lines.

    Rules: `store_init_configuration` updates the package's config; `log` is
    ``run.log(values, step=step, **kwargs)``; `finish` finishes the run. As in
    🤗 Accelerate its ``main_process_only`` is False. Catalog:
    tracking.init_log_end.
    """

    requires_logging_directory = False
    main_process_only = False
    label = ""

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        """The run (set by `start`)."""
        return self.run

    def _package(self) -> Any:
        return importlib.import_module(self.name)

    @on_main_process
    def start(self) -> None:
        self._start()
        debug_started(f"{self.label} project", self.run_name)

    def _start(self) -> None:
        self.run = self._package().init(project=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._package().config.update(values, allow_val_change=True)
        logger.debug(f"Stored initial configuration hyperparameters to {self.label}")

    @on_main_process
    def log(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """``run.log(values, step=step, **kwargs)``."""
        self.run.log(values, step=step, **kwargs)
        logger.debug(f"Successfully logged to {self.label}")

    @on_main_process
    def finish(self) -> None:
        self.run.finish()
        logger.debug(f"{self.label} run closed")


class SwanLabTracker(_PackageRunTracker):
    """SwanLab, through the ``swanlab`` package: ``swanlab.init(project=run_name, **kwargs)``.

    Rules: those of the package-run trackers; `start` also records
    ``FRAMEWORK`` in the run's config (🤗 Accelerate's logo);
    `log_images` logs each list of images as ``swanlab.Image``s.
    Catalog: tracking.init_log_end.
    """

    name = "swanlab"
    label = "SwanLab"

    def _start(self) -> None:
        super()._start()
        self._package().config["FRAMEWORK"] = "🤗Accelerate"

    @on_main_process
    def log_images(self, values: dict[str, Any], step: Optional[int] = None, **kwargs: Any) -> None:
        """Log each list of images of ``values`` (arrays or PIL images) as ``swanlab.Image``s."""
        image = self._package().Image
        for key, images in values.items():
            self.log({key: [image(each) for each in images]}, step=step, **kwargs)
        logger.debug("Successfully logged images to SwanLab")


class TrackioTracker(_PackageRunTracker):
    """Trackio, through the ``trackio`` package: ``trackio.init(project=run_name, **kwargs)``, with the
    rules of the package-run trackers. Catalog: tracking.init_log_end."""

    name = "trackio"
    label = "trackio"
