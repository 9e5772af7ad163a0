"""Experiment tracking on one process, and across ranks (only the main process writes).

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import simulators
from accelerate_ref import Accelerator, AcceleratorState, GradientState, ProjectConfiguration, tracking
from accelerate_ref._tracking import base as tracking_base
from accelerate_ref.tracking import GeneralTracker, JSONLinesTracker, filter_trackers, get_available_trackers
from accelerate_ref.utils import LoggerType, imports, is_mlflow_available, is_tensorboard_available, is_wandb_available


def fresh(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


class Recorder(GeneralTracker):
    name = "recorder"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []

    @property
    def tracker(self):
        return self.calls

    def start(self) -> None:
        self.calls.append("start")

    def store_init_configuration(self, values) -> None:
        self.calls.append(("config", values))

    def log(self, values, step=None, **kwargs) -> None:
        self.calls.append(("log", values, step, kwargs))

    def finish(self) -> None:
        self.calls.append("finish")


@pytest.fixture
def jsonl_registered(monkeypatch):
    """JSONLinesTracker registered as "jsonl" (it is not by default, as 🤗 Accelerate has no such tracker)."""
    monkeypatch.setattr(tracking, "LOGGER_TYPE_TO_CLASS", dict(tracking.LOGGER_TYPE_TO_CLASS))
    tracking.register_tracker_class(JSONLinesTracker)


def test_jsonl_tracker_writes_config_and_one_line_per_log(tmp_path, jsonl_registered):
    acc = fresh(log_with="jsonl", project_config=ProjectConfiguration(project_dir=str(tmp_path)))
    assert acc.log_with == ["jsonl"]
    acc.init_trackers("run", config={"lr": 0.1, "device": torch.device("cpu")})
    acc.log({"loss": torch.tensor(0.5), "note": "warm"}, step=1)
    acc.log({"loss": 0.25}, step=2)
    tracker = acc.get_tracker("jsonl")
    assert isinstance(tracker, JSONLinesTracker) and acc.get_tracker("jsonl", unwrap=True) is tracker.tracker
    acc.end_training()
    folder = tmp_path / "run"
    assert json.loads((folder / "config.json").read_text()) == {"lr": 0.1, "device": "cpu"}
    lines = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    assert [(line["step"], line["values"]) for line in lines] == [(1, {"loss": 0.5, "note": "warm"}), (2, {"loss": 0.25})]
    assert tracker.tracker is None, "finished: the file is closed"


def test_custom_tracker_lifecycle_and_kwargs():
    recorder = Recorder()
    assert filter_trackers([recorder, recorder]) == [recorder, recorder], "an instance is kept each time, as in HF"
    acc = fresh(log_with=recorder)
    assert acc.log_with == [recorder]
    acc.init_trackers("run", config={"a": 1})
    acc.log({"x": 1.0}, step=3, log_kwargs={"recorder": {"commit": False}, "other": {"ignored": True}})
    assert acc.get_tracker("recorder") is recorder and acc.get_tracker("recorder", unwrap=True) is recorder.calls
    with pytest.raises(ValueError, match="missing is not an available tracker stored inside the `Accelerator`."):
        acc.get_tracker("missing")
    acc.end_training()
    assert recorder.calls == ["start", ("config", {"a": 1}), ("log", {"x": 1.0}, 3, {"commit": False}), "finish"]


def test_without_trackers_get_tracker_is_a_blank_tracker():
    acc = fresh()
    blank = acc.get_tracker("anything")
    assert type(blank) is GeneralTracker
    blank.log({"x": 1})
    acc.log({"x": 1})


def test_log_with_is_checked_when_the_accelerator_is_created(tmp_path, jsonl_registered):
    with pytest.raises(ValueError, match="Unsupported logging capability: nonsense"):
        fresh(log_with="nonsense")
    with pytest.raises(ValueError, match="Logging with `jsonl` requires a `logging_dir` to be passed in."):
        fresh(log_with="jsonl")
    assert filter_trackers(LoggerType.ALL) == get_available_trackers(), "all: no logging_dir check"
    installed = get_available_trackers()
    assert all(isinstance(member, LoggerType) for member in installed) and "jsonl" not in installed
    assert {LoggerType.TENSORBOARD, LoggerType.MLFLOW, LoggerType.WANDB} & set(installed) == {
        member for member, present in [(LoggerType.TENSORBOARD, is_tensorboard_available()),
                                       (LoggerType.MLFLOW, is_mlflow_available()),
                                       (LoggerType.WANDB, is_wandb_available())] if present
    }
    assert filter_trackers(None) == []


def test_log_with_takes_names_and_logger_types(monkeypatch, tmp_path):
    for check in ("is_mlflow_available", "is_wandb_available"):
        monkeypatch.setattr(imports, check, lambda: True)
    assert filter_trackers([LoggerType.MLFLOW, "wandb", "mlflow", LoggerType.WANDB], tmp_path) == [
        LoggerType.MLFLOW, LoggerType.WANDB]
    assert tracking.LOGGER_TYPE_TO_CLASS["mlflow"] is tracking.MLflowTracker
    from accelerate_ref import accelerator

    assert accelerator.LOGGER_TYPE_TO_CLASS is tracking.LOGGER_TYPE_TO_CLASS


def test_a_tracker_whose_package_is_missing_is_dropped(monkeypatch, caplog):
    fresh()  # filter_trackers logs the tracker it drops, and the logger needs a state (as HF's)
    monkeypatch.setattr(imports, "is_wandb_available", lambda: False)
    assert LoggerType.WANDB not in get_available_trackers()
    recorder = Recorder()
    with caplog.at_level("DEBUG", logger="accelerate_ref.tracking"):
        assert filter_trackers(["wandb", recorder]) == [recorder]
    assert "[RANK 0] Tried adding logger wandb, but package is unavailable in the system." in caplog.messages
    with pytest.warns(UserWarning, match=r"`log_with=wandb` was passed but no supported trackers are currently installed."):
        assert fresh(log_with="wandb").log_with == []


#: The trackers of accelerate_ref._tracking.trackers, by name, with the availability check of their package.
MORE_TRACKERS = {
    "comet_ml": ("CometMLTracker", "is_comet_ml_available", "comet_ml"),
    "aim": ("AimTracker", "is_aim_available", "aim"),
    "clearml": ("ClearMLTracker", "is_clearml_available", "clearml"),
    "dvclive": ("DVCLiveTracker", "is_dvclive_available", "dvclive"),
    "swanlab": ("SwanLabTracker", "is_swanlab_available", "swanlab"),
    "trackio": ("TrackioTracker", "is_trackio_available", "trackio"),
}


def test_every_logger_type_has_its_tracker_class():
    assert set(LoggerType.list()) - {"all"} <= set(tracking.LOGGER_TYPE_TO_CLASS)
    for name, (class_name, _, _) in MORE_TRACKERS.items():
        assert tracking.LOGGER_TYPE_TO_CLASS[name] is getattr(tracking, class_name) and getattr(tracking, class_name).name == name
    assert (tracking.SwanLabTracker.main_process_only, tracking.TrackioTracker.main_process_only) == (False, False)
    assert tracking.AimTracker.requires_logging_directory and not tracking.CometMLTracker.requires_logging_directory


@pytest.mark.parametrize("name", sorted(MORE_TRACKERS))
def test_a_tracker_whose_package_is_absent_refuses_to_start(monkeypatch, name):
    fresh()  # filter_trackers logs the tracker it drops, and the logger needs a state (as HF's)
    class_name, check, package = MORE_TRACKERS[name]
    monkeypatch.setattr(imports, check, lambda: False)
    monkeypatch.setitem(__import__("sys").modules, package, None)  # an import of it fails
    tracker = getattr(tracking, class_name)("run")
    with pytest.raises(ModuleNotFoundError):
        tracker.start()
    if name == "dvclive":
        assert tracker.tracker is None, "the Live given (none), as in HF"
    else:
        with pytest.raises(AttributeError):
            tracker.tracker  # no run before start, as in HF  # noqa: B018
    assert filter_trackers([name, Recorder()])[0].name == "recorder", "log_with drops it, as the other trackers"


@pytest.mark.parametrize("name", sorted(MORE_TRACKERS))
def test_an_installed_tracker_is_accepted_by_log_with(monkeypatch, tmp_path, name):
    monkeypatch.setattr(imports, MORE_TRACKERS[name][1], lambda: True)
    assert filter_trackers(name, tmp_path) == [LoggerType(name)]


def test_availability_checks_do_not_import_the_packages(monkeypatch):
    import sys

    for name, (_, check, package) in MORE_TRACKERS.items():
        monkeypatch.delitem(sys.modules, package, raising=False)
        getattr(imports, check)()
        assert package not in sys.modules, f"{check} imported {package}"


def test_clearml_titles_and_series():
    split = tracking.ClearMLTracker._get_title_series
    assert [split(k) for k in ("eval_loss", "test_acc", "train_loss", "loss", "evaluation")] == [
        ("loss", "eval"), ("acc", "test"), ("loss", "train"), ("loss", "train"), ("evaluation", "train")]


def test_register_tracker_class_makes_a_name_usable(monkeypatch):
    monkeypatch.setattr(tracking, "LOGGER_TYPE_TO_CLASS", dict(tracking.LOGGER_TYPE_TO_CLASS))
    made = []

    class Named(Recorder):
        name = "named"

        def __init__(self, project_name, **kwargs):
            super().__init__()
            made.append((project_name, kwargs))

    tracking.register_tracker_class(Named)
    acc = fresh(log_with="named")
    acc.init_trackers("proj", init_kwargs={"named": {"colour": "blue"}})
    assert made == [("proj", {"colour": "blue"})] and acc.get_tracker("named").calls == ["start"]
    with pytest.warns(UserWarning, match="already registered"):
        tracking.register_tracker_class(Named)
    with pytest.raises(ValueError, match="subclass of `GeneralTracker`"):
        tracking.register_tracker_class(dict)
    with pytest.raises(ValueError, match="non-empty `name`"):
        tracking.register_tracker_class(type("Blank", (GeneralTracker,), {"requires_logging_directory": False}))


def test_incomplete_custom_tracker_is_named():
    class Nameless(GeneralTracker):
        pass

    with pytest.raises(NotImplementedError, match="define them in the class definition: `name`, `requires_logging_directory`, `tracker`"):
        Nameless()


def test_main_process_only_methods_do_nothing_elsewhere(monkeypatch, tmp_path):
    class Elsewhere:
        is_main_process = False

    tracker = JSONLinesTracker("run", tmp_path)
    monkeypatch.setattr(tracking_base, "PartialState", Elsewhere)
    tracker.start()
    tracker.log({"x": 1})
    assert not (tmp_path / "run").exists()


def test_end_training_tears_down_the_process_group(monkeypatch):
    acc = fresh(log_with=Recorder())
    torn = []
    monkeypatch.setattr(type(acc.state), "destroy_process_group", lambda self, group=None: torn.append(group), raising=False)
    acc.end_training()
    assert torn == [None]


def test_tensorboard_tracker(tmp_path):
    pytest.importorskip("tensorboard")
    acc = fresh(log_with="tensorboard", project_dir=str(tmp_path))
    acc.init_trackers("tb", config={"lr": 0.1})
    acc.log({"loss": 0.5, "text": "hello", "pair": {"a": 1.0, "b": 2.0}}, step=1)
    acc.end_training()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))
    # Read back with TensorBoard's own reader: the scalar, at its step, and the text.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5)]
    assert any("text" in tag for tag in events.Tags()["tensors"]), events.Tags()


def test_tensorboard_tracker_log_images(tmp_path):
    pytest.importorskip("tensorboard")
    acc = fresh(log_with="tensorboard", project_dir=str(tmp_path))
    acc.init_trackers("tb")
    acc.get_tracker("tensorboard").log_images({"pictures": torch.zeros(2, 3, 4, 4)}, step=5)
    acc.end_training()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0}).Reload()
    # add_images lays the batch out as one grid: two 4x4 images side by side.
    assert [(e.step, e.width, e.height) for tag in events.Tags()["images"] for e in events.Images(tag)] == [(5, 8, 4)]


# -- real packages: MLflow (a local file store) and W&B (offline), read back from their own stores ----------


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A fresh MLflow file store at ``tmp_path/mlruns`` (its tracking URI), no telemetry."""
    pytest.importorskip("mlflow")
    uri = "file:" + str(tmp_path / "mlruns")
    for key, value in {"MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true"}.items():
        monkeypatch.setenv(key, value)
    yield uri
    import mlflow

    while mlflow.active_run() is not None:
        mlflow.end_run()


def test_mlflow_tracker_records_params_and_metrics_at_their_steps(mlflow_store, tmp_path):
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    from conformance.support.tracker_stores import mlflow_runs

    acc = fresh(log_with=LoggerType.MLFLOW)
    acc.init_trackers("proj", config={"lr": 0.1, "huge": "x" * (MAX_PARAM_VAL_LENGTH + 1)}, init_kwargs={"mlflow": {"run_name": "first"}})
    run = acc.get_tracker("mlflow", unwrap=True)
    assert run.info.run_name == "first"
    acc.log({"loss": 0.5, "note": "not a number"}, step=1)
    acc.log({"loss": 0.25}, step=2)
    artifact = tmp_path / "notes.txt"
    artifact.write_text("hello")
    acc.get_tracker("mlflow").log_artifact(str(artifact))
    acc.end_training()
    assert mlflow_runs(mlflow_store, "proj") == [
        {"status": "FINISHED", "params": {"lr": "0.1"}, "metrics": {"loss": [[1, 0.5], [2, 0.25]]}}
    ], "the long parameter and the string metric are dropped"
    from mlflow import MlflowClient

    assert [f.path for f in MlflowClient(mlflow_store).list_artifacts(run.info.run_id)] == ["notes.txt"]


def test_mlflow_tracker_environment_takes_precedence(mlflow_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "ref"}')
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "false")
    tracker = tracking.MLflowTracker("from-argument", tags={"team": "argument"}, nested_run=True)
    assert (tracker.experiment_name, tracker.tags, tracker.nested_run) == ("from-env", {"team": "ref"}, False)
    tracker.start()
    tracker.finish()
    from mlflow import MlflowClient

    run = MlflowClient(mlflow_store).get_run(tracker.tracker.info.run_id)
    assert run.data.tags["team"] == "ref"
    assert MlflowClient(mlflow_store).get_experiment(run.info.experiment_id).name == "from-env"


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B in offline mode writing under ``tmp_path``; its service stopped afterwards."""
    wandb = pytest.importorskip("wandb")
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_CONSOLE": "off",
                       # wandb's caches and staging too, so nothing is written to HOME
                       "WANDB_CACHE_DIR": str(tmp_path / "cache"), "WANDB_DATA_DIR": str(tmp_path / "data"),
                       "WANDB_CONFIG_DIR": str(tmp_path / "config")}.items():
        monkeypatch.setenv(key, value)
    yield str(tmp_path)
    wandb.teardown()


def test_wandb_tracker_offline_run_read_back(wandb_offline):
    from conformance.support.tracker_stores import wandb_offline_runs

    acc = fresh(log_with="wandb")
    acc.init_trackers("proj", config={"lr": 0.1})
    acc.log({"loss": 0.5}, step=1)
    acc.get_tracker("wandb").log_table("table", columns=["a"], data=[[1]], step=2)
    # Enough rows to cross wandb's 32 KiB blocks, so records split in FIRST/MIDDLE/LAST chunks are read too.
    for step in range(3, 33):
        acc.log({"loss": float(step), "text": "x" * 3000}, step=step)
    acc.end_training()
    import wandb

    wandb.teardown()
    (run,) = wandb_offline_runs(wandb_offline)
    assert (run["project"], run["config"], run["exited"]) == ("proj", {"lr": 0.1}, True)
    assert [step for step, _ in run["history"]] == list(range(1, 33))
    table = run["history"][1][1]  # nested keys are joined with "/"
    assert run["history"][0][1] == {"loss": 0.5} and (table["table/_type"], table["table/nrows"]) == ("table-file", 1)
    assert run["history"][-1][1] == {"loss": 32.0, "text": "x" * 3000}


def test_wandb_tracker_methods_are_not_restricted_to_the_main_process():
    assert tracking.WandBTracker.main_process_only is False and tracking.MLflowTracker.main_process_only is True


def test_a_file_that_is_not_a_wandb_run_is_refused(tmp_path):
    from conformance.support.tracker_stores import _wandb_records

    path = tmp_path / "run-x.wandb"
    path.write_bytes(b"not a run")
    with pytest.raises(ValueError, match="not a W&B run file"):
        list(_wandb_records(str(path)))


# -- across ranks --------------------------------------------------------------------------


def tracking_on_every_rank(folder: str) -> dict:
    acc = Accelerator(log_with=[JSONLinesTracker("run", folder), Recorder()])
    acc.init_trackers("run", config={"world": acc.num_processes})
    acc.log({"rank": acc.process_index}, step=0)
    found = acc.get_tracker("recorder")
    report = {"trackers": [t.name for t in acc.trackers], "found": type(found).__name__, "calls": getattr(found, "calls", None)}
    acc.end_training()
    return report


@pytest.mark.slow
def test_only_the_main_process_tracks(tmp_path):
    reports = simulators.run(tracking_on_every_rank, world=2, args=(str(tmp_path),), timeout=240)
    assert reports[0]["trackers"] == ["jsonl", "recorder"] and reports[0]["found"] == "Recorder"
    assert reports[1] == {"trackers": [], "found": "GeneralTracker", "calls": None}
    lines = (tmp_path / "run" / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["values"] for line in lines] == [{"rank": 0}], "one line, from the main process"


@pytest.mark.parametrize("case_name, package", [("tracking_mlflow", "mlflow"), ("tracking_wandb", "wandb"),
                                                ("tracking_comet_ml", "comet_ml"), ("tracking_aim", "aim"),
                                                ("tracking_clearml", "clearml"), ("tracking_dvclive", "dvclive")])
def test_a_real_tracker_case_is_not_supported_without_its_package(monkeypatch, case_name, package):
    import importlib.util

    from conformance.cases import test_tracking as cases
    from conformance.engine.case import NotSupported, WorldInfo

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real_find_spec(name, *a))
    with pytest.raises(NotSupported, match=f"the {package} package is not installed"):
        getattr(cases, case_name).function(None, WorldInfo.parse("2"))


# -- trackers-more: what `log` does beyond the cases' numbers, read back from each package's store ------------


def comet_and_clearml_extras(folder: str) -> dict:
    """In a rank (ClearML and Comet hook into the process they run in): Comet's dict values and ClearML's
    prefixed keys and step-less values, each read back from the package's offline store."""
    import importlib.util

    from conformance.support.tracker_stores import clearml_offline_session, comet_offline_runs

    found = {}
    if importlib.util.find_spec("comet_ml"):
        os.environ["COMET_OFFLINE_DIRECTORY"] = os.path.join(folder, "comet")
        comet = tracking.CometMLTracker("extras", online=False)
        comet.start()
        comet.log({"loss": 0.5, "pair": {"a": 1.0, "b": 2.0}, "ignored": [1]}, step=3)
        comet.finish()
        (run,) = comet_offline_runs(os.path.join(folder, "comet"))
        found["comet"] = {key: run["metrics"][key] for key in ("loss", "a", "b")}
    if importlib.util.find_spec("clearml"):
        config = os.path.join(folder, "clearml.conf")
        with open(config, "w") as stream:
            stream.write("sdk.development.report_use_subprocess: false\n")
        os.environ.update(CLEARML_OFFLINE_MODE="1", CLEARML_CONFIG_FILE=config, HOME=folder,
                          CLEARML_CACHE_DIR=os.path.join(folder, "clearml"))
        clearml = tracking.ClearMLTracker("extras", auto_connect_frameworks=False, auto_resource_monitoring=False,
                                          auto_connect_streams=False, auto_connect_arg_parser=False)
        clearml.start()
        clearml.log({"eval_loss": 0.5, "test_acc": 0.75, "note": "dropped"}, step=2)
        clearml.log({"final": 3.0})
        folder_of_task = clearml.tracker.get_offline_mode_folder()
        clearml.finish()
        found["clearml"] = clearml_offline_session(folder_of_task)["scalars"]
    return found


@pytest.mark.slow
def test_comet_and_clearml_log_read_back_offline(tmp_path):
    if not (imports.is_comet_ml_available() or imports.is_clearml_available()):
        pytest.skip("neither comet_ml nor clearml is installed (pip install .[trackers-more])")
    (found,) = simulators.run(comet_and_clearml_extras, world=1, args=(str(tmp_path),), timeout=240)
    if "comet" in found:
        assert found["comet"] == {"loss": [[3, 0.5]], "a": [[3, 1.0]], "b": [[3, 2.0]]}, "a dict is logged as metrics"
    if "clearml" in found:
        assert found["clearml"] == {"loss/eval": [[2, 0.5]], "acc/test": [[2, 0.75]], "Summary/final": [[None, 3.0]]}
