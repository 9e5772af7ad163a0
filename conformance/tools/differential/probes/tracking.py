"""Probes of ``accelerate.tracking``: the tracker classes, `filter_trackers`, `register_tracker_class`,
`on_main_process`, and the Accelerator's ``log_with``/`init_trackers`/`log`/`get_tracker`/`end_training`.

Trackers run offline: TensorBoard into ``api.tmp``, MLflow into a file store
there, W&B in offline mode there; the trackers whose packages are not
installed here (Comet, Aim, ClearML, DVCLive, SwanLab, Trackio) show their
refusals. What a tracker wrote is read back with the package's own reader
(``conformance.support.tracker_stores``, TensorBoard's ``EventAccumulator``) and
recorded as values; its folder is then listed with its timestamps and run
ids blanked, and removed, so the harness's file listing holds no names that
differ from run to run. Log records are recorded at DEBUG level (what a user
with ``ACCELERATE_LOG_LEVEL=DEBUG`` sees) around tracker calls.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..probe import Api, probe

#: Trackers whose packages are not installed here, with their methods beyond the GeneralTracker interface.
ABSENT = {
    "CometMLTracker": (),
    "AimTracker": ("log_images",),
    "ClearMLTracker": ("log_images", "log_table"),
    "DVCLiveTracker": (),
    "SwanLabTracker": ("log_images",),
    "TrackioTracker": (),
}
#: Attributes of a tracker a user reads (each recorded, or what reading it raised).
ATTRIBUTES = ("name", "requires_logging_directory", "main_process_only", "run_name", "logging_dir",
              "logging_dir_param", "init_kwargs")
_RUN_ID = re.compile(r"[0-9a-f]{32}|(?<=run-)[0-9a-z]{8}")
_DIGITS = re.compile(r"\d+")


# -- helpers -------------------------------------------------------------------------------------------------


def record_attributes(api: Api, label: str, tracker: Any, names: tuple[str, ...] = ATTRIBUTES) -> None:
    for name in names:
        api.observe(f"{label}.{name}", getattr, tracker, name)


def take_folder(api: Api, label: str, folder: Path) -> None:
    """Record the files under ``folder`` (run ids and numbers blanked) and remove it."""
    names = sorted(_DIGITS.sub("N", _RUN_ID.sub("<id>", path.relative_to(api.tmp).as_posix()))
                   for path in folder.rglob("*") if path.is_file())
    api.record(label, names)
    shutil.rmtree(folder, ignore_errors=True)


def recorder_class(api: Api, **attributes: Any) -> type:
    """A `GeneralTracker` subclass of the implementation that records every call it gets."""

    class Recorder(api.get("tracking.GeneralTracker")):
        name = "recorder"
        requires_logging_directory = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.calls: list = [["init", list(args), kwargs]]

        @property
        def tracker(self) -> list:
            return self.calls

        def start(self) -> None:
            self.calls.append(["start"])

        def store_init_configuration(self, values: dict) -> None:
            self.calls.append(["config", values])

        def log(self, values: dict, step: Any = None, **kwargs: Any) -> None:
            self.calls.append(["log", values, step, kwargs])

        def finish(self) -> None:
            self.calls.append(["finish"])

    for key, value in attributes.items():
        setattr(Recorder, key, value)
    return Recorder


@contextlib.contextmanager
def registry_kept(api: Api) -> Iterator[dict]:
    """``LOGGER_TYPE_TO_CLASS``, restored to its entries before the block when it ends."""
    registry = api.get("tracking.LOGGER_TYPE_TO_CLASS")
    saved = dict(registry)
    try:
        yield registry
    finally:
        registry.clear()
        registry.update(saved)


def tensorboard_events(folder: Path) -> dict[str, Any]:
    """What TensorBoard's own reader finds under ``folder``: scalars, text and image tags by step."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    multiplexer = EventMultiplexer(size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    multiplexer.AddRunsFromDirectory(str(folder)).Reload()
    found: dict[str, Any] = {}
    for run in sorted(multiplexer.Runs()):
        events = multiplexer.GetAccumulator(run)
        tags = events.Tags()
        key = _DIGITS.sub("N", os.path.relpath(os.path.join(str(folder), run), str(folder)))
        found.setdefault(key, []).append({
            "scalars": {tag: [[e.step, e.value] for e in events.Scalars(tag)] for tag in sorted(tags["scalars"])},
            "tensors": {tag: [e.step for e in events.Tensors(tag)] for tag in sorted(tags["tensors"])},
            "images": {tag: [[e.step, e.width, e.height] for e in events.Images(tag)] for tag in sorted(tags["images"])},
        })
    return found


def hparams_files(folder: Path) -> list[Any]:
    import yaml

    return [yaml.safe_load(path.read_text()) for path in sorted(folder.rglob("hparams.yml"))]


# -- the base class, the decorator, the registry ----------------------------------------------------------------


@probe("tracking")
def general_tracker(api: Api) -> None:
    base = api.get("tracking.GeneralTracker")
    record_attributes(api, "class", base, ("main_process_only", "name", "requires_logging_directory"))
    api.observe("an incomplete tracker", base)
    blank = api.observe("a blank tracker", base, _blank=True)
    api.observe("blank start", blank.start)
    api.observe("blank store_init_configuration", blank.store_init_configuration, {"a": 1})
    api.observe("blank log", blank.log, {"a": 1}, step=2, commit=False)
    api.observe("blank finish", blank.finish)
    api.observe("blank tracker", getattr, blank, "tracker")
    without_tracker = type("WithoutTracker", (base,), {"name": "x", "requires_logging_directory": False})
    api.observe("without tracker", without_tracker)
    without_name = type("WithoutName", (base,), {"requires_logging_directory": False, "tracker": None})
    api.observe("without name", without_name)
    without_directory = type("WithoutDirectory", (base,), {"name": "x", "tracker": property(lambda self: 1)})
    api.observe("without requires_logging_directory", without_directory)
    complete = api.observe("complete", recorder_class(api), "project", flag=True)
    api.observe("complete tracker", getattr, complete, "tracker")


class _Plain:
    """An object without ``main_process_only``: `on_main_process` runs its methods everywhere."""

    def __init__(self, decorator: Any) -> None:
        self.ran = decorator(_Plain.ran)

    def ran(self, value: int) -> list:
        """Returns what it ran with."""
        return ["ran", value]


@probe("tracking", worlds=(1, 2))
def on_main_process(api: Api) -> None:
    api.partial_state()
    decorate = api.get("tracking.on_main_process")
    wrapped = api.observe("decorate", decorate, _Plain.ran)
    api.record("keeps the name and docstring", [wrapped.__name__, wrapped.__doc__])
    for only in (True, False):
        tracker_class = recorder_class(api, main_process_only=only)
        tracker_class.log = decorate(tracker_class.log)
        tracker = tracker_class()
        api.observe(f"main_process_only={only}", tracker.log, {"rank": api.rank}, step=1)
        api.record(f"main_process_only={only} calls", tracker.calls)
    plain = _Plain(decorate)
    api.observe("without main_process_only", plain.ran, 3)


@probe("tracking")
def available_trackers(api: Api) -> None:
    api.call("get_available_trackers", "tracking.get_available_trackers")
    registry = api.get("tracking.LOGGER_TYPE_TO_CLASS")
    api.record("LOGGER_TYPE_TO_CLASS", {name: cls.__name__ for name, cls in registry.items()})
    api.record("the accelerator module's registry is the same", api.get("accelerator.LOGGER_TYPE_TO_CLASS") is registry)
    for name, cls in registry.items():
        record_attributes(api, name, cls, ("name", "requires_logging_directory", "main_process_only"))


@probe("tracking")
def register_tracker_class(api: Api) -> None:
    register = api.get("tracking.register_tracker_class")
    base = api.get("tracking.GeneralTracker")
    with registry_kept(api) as registry:
        api.observe("not a class", register, recorder_class(api)())
        api.observe("not a GeneralTracker", register, dict)
        api.observe("no name", register, type("Nameless", (base,), {"requires_logging_directory": False}))
        api.observe("an empty name", register, type("Empty", (base,), {"name": "", "requires_logging_directory": False}))
        api.observe("no requires_logging_directory", register, type("NoDirectory", (base,), {"name": "nodir"}))
        custom = recorder_class(api, name="custom")
        api.observe("a new name", register, custom)
        api.record("registered", registry.get("custom") is custom)
        api.observe("the same name again", register, custom)
        api.observe("a built-in name", register, recorder_class(api, name="tensorboard"))
        api.record("built-in replaced", registry["tensorboard"].__name__)


@probe("tracking")
def filter_trackers(api: Api) -> None:
    api.partial_state()
    pick = api.get("tracking.filter_trackers")
    logger_type = api.get("utils.LoggerType")
    folder = str(api.tmp)
    recorder = recorder_class(api)()
    with api.logs_at(logging.DEBUG):
        api.observe("None", pick, None)
        api.observe("an empty list", pick, [])
        api.observe("a name", pick, "tensorboard", folder)
        api.observe("a name without logging_dir", pick, "tensorboard")
        api.observe("names and members, repeated", pick, ["mlflow", logger_type.MLFLOW, "wandb", "mlflow"])
        api.observe("a tuple", pick, (logger_type.WANDB, "tensorboard"), folder)
        api.observe("all", pick, "all")
        api.observe("LoggerType.ALL with a tracker", pick, [recorder, logger_type.ALL])
        api.observe("all, a tracker and a name", pick, ["tensorboard", "all", recorder])
        api.observe("a tracker twice", pick, [recorder, recorder])
        api.observe("a tracker", pick, recorder)
        api.observe("an unknown name", pick, "nonsense")
        api.observe("an unknown name after a good one", pick, ["wandb", "nonsense"])
        api.observe("a number", pick, 3)
        api.observe("a tracker class", pick, [recorder_class(api)])
        api.observe("absent packages", pick, ["comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio"])
        api.observe("an absent package's member", pick, [logger_type.COMETML, "mlflow"])
        with registry_kept(api):
            api.get("tracking.register_tracker_class")(recorder_class(api, name="files", requires_logging_directory=True))
            api.observe("a registered name needing a folder", pick, "files")
            api.observe("a registered name with a folder", pick, ["files", "files"], folder)


# -- the trackers whose packages are installed ---------------------------------------------------------------


@probe("tracking")
def tensorboard_tracker(api: Api) -> None:
    api.partial_state()
    tracker_class = api.get("tracking.TensorBoardTracker")
    with api.logs_at(logging.DEBUG):
        tracker = api.observe("create", tracker_class, "run", api.tmp / "tb", flush_secs=30)
        record_attributes(api, "created", tracker)
        api.observe("tracker before start", getattr, tracker, "tracker")
        api.observe("start", tracker.start)
        record_attributes(api, "started", tracker)
        api.observe("tracker", getattr, tracker, "tracker")
        api.observe("store_init_configuration", tracker.store_init_configuration, {"lr": 0.1, "name": "x", "on": True})
        api.observe("store_init_configuration of a list", tracker.store_init_configuration, {"sizes": [1, 2]})
        api.observe("log", tracker.log, {"loss": 0.5, "count": 3, "note": "hi", "pair": {"a": 1.0, "b": 2.0},
                                         "tensor": torch.tensor(0.75), "ignored": [1, 2]}, step=1)
        api.observe("log without step", tracker.log, {"loss": 0.25})
        api.observe("log_images", tracker.log_images, {"pictures": np.zeros((2, 3, 4, 4), dtype=np.float32)}, step=5)
        api.observe("log_images of a bad shape", tracker.log_images, {"bad": np.zeros((4,))}, step=6)
        api.observe("finish", tracker.finish)
    folder = api.tmp / "tb"
    api.record("hparams.yml", hparams_files(folder))
    api.record("events", tensorboard_events(folder))
    take_folder(api, "tensorboard files", folder)
    api.observe("a missing logging_dir", tracker_class, "run")
    api.observe("start with logging_dir None", tracker_class("run", None).start)


@probe("tracking")
def mlflow_tracker(api: Api) -> None:
    from conformance.support.tracker_stores import mlflow_runs

    api.partial_state()
    uri = f"file:{api.tmp / 'mlruns'}"
    os.environ.update(MLFLOW_TRACKING_URI=uri, MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_DISABLE_TELEMETRY="true")
    tracker_class = api.get("tracking.MLflowTracker")
    names = ATTRIBUTES + ("experiment_name", "run_id", "tags", "nested_run", "description")
    import mlflow
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    try:
        with api.logs_at(logging.DEBUG):
            tracker = api.observe("create", tracker_class, "experiment", str(api.tmp / "artifacts"),
                                  tags='{"team": "a"}', run_name="first", description="about")
            record_attributes(api, "created", tracker, names)
            api.observe("tracker before start", getattr, tracker, "tracker")
            api.observe("start", tracker.start)
            api.observe("tracker", getattr, tracker, "tracker")
            api.observe("store_init_configuration", tracker.store_init_configuration,
                        {"lr": 0.1, "long": "x" * (MAX_PARAM_VAL_LENGTH + 1), **{f"p{i}": i for i in range(120)}})
            api.observe("log", tracker.log, {"loss": 0.5, "count": 2, "note": "not a number"}, step=1)
            api.observe("log again", tracker.log, {"loss": 0.25}, step=2)
            (api.tmp / "notes").mkdir()
            (api.tmp / "notes" / "a.txt").write_text("a")
            api.observe("log_artifact", tracker.log_artifact, str(api.tmp / "notes" / "a.txt"))
            api.observe("log_artifacts", tracker.log_artifacts, str(api.tmp / "notes"), "copied")
            api.observe("log_figure of an object", tracker.log_figure, object(), "figure.png")
            api.observe("finish", tracker.finish)
            again = tracker_class("experiment")
            api.observe("start in the same experiment", again.start)
            api.observe("finish again", again.finish)
        runs = mlflow_runs(uri, "experiment")
        for run in runs:
            run["params"] = {key: value for key, value in run["params"].items() if not key.startswith("p")}
        api.record("runs", runs)
        artifacts = mlflow.MlflowClient(uri).list_artifacts(tracker.tracker.info.run_id)
        api.record("artifacts", sorted(item.path for item in artifacts))
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
    take_folder(api, "mlflow files", api.tmp / "mlruns")
    take_folder(api, "artifact files", api.tmp / "artifacts")


@probe("tracking", env={"MLFLOW_EXPERIMENT_NAME": "from-env", "MLFLOW_RUN_ID": "abc", "MLFLOW_TAGS": '{"t": "env"}',
                        "MLFLOW_NESTED_RUN": "yes"})
def mlflow_environment(api: Api) -> None:
    tracker_class = api.get("tracking.MLflowTracker")
    names = ("experiment_name", "run_id", "tags", "nested_run", "run_name", "logging_dir")
    record_attributes(api, "from the environment", tracker_class("argument", tags={"t": "arg"}, nested_run=False), names)
    os.environ["MLFLOW_NESTED_RUN"] = "maybe"
    api.observe("an unreadable MLFLOW_NESTED_RUN", tracker_class, "argument")
    os.environ["MLFLOW_NESTED_RUN"] = "0"
    os.environ["MLFLOW_TAGS"] = "not json"
    api.observe("unreadable MLFLOW_TAGS", tracker_class, "argument")


@probe("tracking", env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                        "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off"})
def wandb_tracker(api: Api) -> None:
    import wandb

    from conformance.support.tracker_stores import wandb_offline_runs

    api.partial_state()
    for variable, folder in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "wandb-cache"), ("WANDB_DATA_DIR", "wandb-data"),
                             ("WANDB_CONFIG_DIR", "wandb-config")):  # nothing written outside api.tmp
        os.environ[variable] = str(api.tmp / folder)
    tracker_class = api.get("tracking.WandBTracker")
    try:
        with api.logs_at(logging.DEBUG):
            tracker = api.observe("create", tracker_class, "project", tags=["a"])
            record_attributes(api, "created", tracker)
            api.observe("tracker before start", getattr, tracker, "tracker")
            api.observe("store_init_configuration before start", tracker.store_init_configuration, {"lr": 0.1})
            api.observe("log before start", tracker.log, {"loss": 0.5})
            api.observe("start", tracker.start)
            api.observe("tracker", getattr, tracker, "tracker")
            api.observe("store_init_configuration", tracker.store_init_configuration, {"lr": 0.1, "name": "x"})
            api.observe("store_init_configuration changes a value", tracker.store_init_configuration, {"lr": 0.2})
            api.observe("log", tracker.log, {"loss": 0.5, "note": "hi"}, step=1)
            api.observe("log_images", tracker.log_images, {"pictures": [np.zeros((4, 4, 3), dtype=np.uint8)]}, step=2)
            api.observe("log_table", tracker.log_table, "table", columns=["a", "b"], data=[[1, 2]], step=3)
            api.observe("log_table without data", tracker.log_table, "empty", step=4)
            api.observe("log at an older step", tracker.log, {"loss": 0.1}, step=1)
            api.observe("finish", tracker.finish)
    finally:
        wandb.teardown()
    runs = wandb_offline_runs(str(api.tmp))
    for run in runs:
        run["history"] = [[step, sorted(row)] for step, row in run["history"]]
    api.record("runs", runs)
    for folder in ("wandb", "wandb-cache", "wandb-data", "wandb-config"):
        shutil.rmtree(api.tmp / folder, ignore_errors=True)


# -- the trackers whose packages are not installed ---------------------------------------------------------------


class _Live:
    """A stand-in for a ``dvclive.Live`` given to DVCLiveTracker."""

    def __init__(self) -> None:
        self.calls: list = []

    def log_params(self, values: dict) -> None:
        self.calls.append(["log_params", values])

    def end(self) -> None:
        self.calls.append(["end"])


@probe("tracking")
def absent_packages(api: Api) -> None:
    api.partial_state()
    for class_name, extra_methods in ABSENT.items():
        tracker_class = api.get(f"tracking.{class_name}")
        record_attributes(api, class_name, tracker_class, ("name", "requires_logging_directory", "main_process_only"))
        tracker = api.observe(f"{class_name} create", tracker_class, "run")
        if tracker is None:
            continue
        record_attributes(api, f"{class_name} created", tracker,
                          ATTRIBUTES + ("aim_repo_path", "user_provided_run_name", "live"))
        api.observe(f"{class_name} tracker", getattr, tracker, "tracker")
        api.observe(f"{class_name} start", tracker.start)
        api.observe(f"{class_name} store_init_configuration", tracker.store_init_configuration, {"lr": 0.1})
        api.observe(f"{class_name} log", tracker.log, {"loss": 0.5}, step=1)
        api.observe(f"{class_name} log nothing", tracker.log, {})
        for method in extra_methods:
            api.observe(f"{class_name} {method}", getattr(tracker, method), "table" if method == "log_table" else {"a": 1})
        api.observe(f"{class_name} finish", tracker.finish)
    clearml = api.get("tracking.ClearMLTracker")(None, project_name="p")
    api.observe("ClearML log_table without data", clearml.log_table, "eval_table")
    api.observe("ClearML log_table with a frame", clearml.log_table, "eval_table", dataframe=[[1]])
    live = _Live()
    dvclive = api.get("tracking.DVCLiveTracker")(live=live, dir="x")
    api.observe("DVCLive with a Live: start", dvclive.start)
    api.observe("DVCLive with a Live: tracker is it", lambda: dvclive.tracker is live)
    api.observe("DVCLive with a Live: store_init_configuration", dvclive.store_init_configuration, {"lr": 0.1})
    api.observe("DVCLive with a Live: log", dvclive.log, {"loss": 0.5}, step=1)
    api.observe("DVCLive with a Live: finish", dvclive.finish)
    api.record("DVCLive with a Live: calls", live.calls)
    api.observe("Aim default folder", getattr, api.get("tracking.AimTracker")("run"), "aim_repo_path")


# -- the Accelerator's tracking methods ------------------------------------------------------------------------


@probe("tracking")
def accelerator_log_with(api: Api) -> None:
    accelerator = api.observe("nothing", api.accelerator)
    api.observe("log_with", getattr, accelerator, "log_with")
    api.observe("trackers", getattr, accelerator, "trackers")
    api.observe("get_tracker without trackers", accelerator.get_tracker, "tensorboard")
    api.observe("unwrap without trackers", accelerator.get_tracker, "tensorboard", unwrap=True)
    api.observe("log without trackers", accelerator.log, {"loss": 1.0})
    api.observe("init_trackers without trackers", accelerator.init_trackers, "p", config={"a": 1})
    with api.logs_at(logging.DEBUG):
        for label, log_with in (("absent packages", ["comet_ml", "aim"]), ("an empty list", []),
                                ("an unknown name", "nonsense"), ("a name needing a folder", "tensorboard"),
                                ("all", "all"), ("a member", api.get("utils.LoggerType").MLFLOW)):
            accelerator = api.observe(label, api.accelerator, log_with=log_with)
            if accelerator is not None:
                api.observe(f"{label}: log_with", getattr, accelerator, "log_with")
    accelerator = api.observe("with a project_dir", api.accelerator, log_with=["tensorboard", "comet_ml"],
                              project_dir=str(api.tmp))
    api.observe("with a project_dir: log_with", getattr, accelerator, "log_with")


@probe("tracking", worlds=(1, 2))
def accelerator_custom_tracker(api: Api) -> None:
    recorder = recorder_class(api)()
    other = recorder_class(api, name="other")()
    accelerator = api.accelerator(log_with=[recorder, other])
    api.observe("log_with", lambda: [type(item).__name__ for item in accelerator.log_with])
    api.observe("init_trackers", accelerator.init_trackers, "project", config={"lr": 0.1},
                init_kwargs={"recorder": {"ignored": True}})
    api.observe("trackers", lambda: [tracker.name for tracker in accelerator.trackers])
    api.observe("log", accelerator.log, {"loss": 0.5}, step=1, log_kwargs={"recorder": {"commit": False}})
    api.observe("log without step", accelerator.log, {"loss": 0.25})
    found = api.observe("get_tracker", accelerator.get_tracker, "recorder")
    api.record("get_tracker is the tracker", found is recorder)
    api.record("get_tracker unwrap is its tracker", accelerator.get_tracker("other", unwrap=True) is other.calls)
    api.observe("get_tracker of an unknown name", accelerator.get_tracker, "wandb")
    api.observe("get_tracker of an unknown name, unwrapped", accelerator.get_tracker, "wandb", unwrap=True)
    api.observe("init_trackers again", accelerator.init_trackers, "again")
    api.observe("trackers after init_trackers again", lambda: [tracker.name for tracker in accelerator.trackers])
    if api.world_size == 1:  # end_training destroys the process group the rank pool keeps
        api.observe("end_training", accelerator.end_training)
    api.record("calls", recorder.calls)
    api.record("other calls", other.calls)


@probe("tracking")
def accelerator_registered_tracker(api: Api) -> None:
    with registry_kept(api):
        register = api.get("tracking.register_tracker_class")
        register(recorder_class(api, name="plain"))
        register(recorder_class(api, name="files", requires_logging_directory=True))
        accelerator = api.accelerator(log_with=["plain", "files"], project_dir=str(api.tmp))
        api.observe("log_with", getattr, accelerator, "log_with")
        api.observe("init_trackers", accelerator.init_trackers, "project", init_kwargs={"files": {"colour": "blue"}})
        for name in ("plain", "files"):
            api.observe(f"{name} calls", lambda name=name: accelerator.get_tracker(name).calls)


@probe("tracking", worlds=(1, 2))
def accelerator_tensorboard(api: Api) -> None:
    accelerator = api.accelerator(log_with="tensorboard", project_dir=str(api.tmp))
    api.observe("log_with", getattr, accelerator, "log_with")
    with api.logs_at(logging.DEBUG):
        api.observe("init_trackers", accelerator.init_trackers, "project", config={"lr": 0.1},
                    init_kwargs={"tensorboard": {"flush_secs": 30}})
        api.observe("log", accelerator.log, {"loss": 0.5}, step=1, log_kwargs={"tensorboard": {"walltime": 1.0}})
        tracker = api.observe("get_tracker", accelerator.get_tracker, "tensorboard")
        api.observe("get_tracker unwrap", accelerator.get_tracker, "tensorboard", unwrap=True)
        record_attributes(api, "tracker", tracker)
        api.observe("log with a wrong keyword", accelerator.log, {"loss": 0.5}, log_kwargs={"tensorboard": {"bad": 1}})
        if api.world_size == 1:
            api.observe("end_training", accelerator.end_training)
        else:
            api.observe("finish", tracker.finish)
    if api.rank == 0:
        folder = api.tmp / "project"
        api.record("events", tensorboard_events(folder))
        api.record("hparams.yml", hparams_files(folder))
        take_folder(api, "tensorboard files", folder)
