"""Experiment tracking on one process, and across ranks (only the main process writes).

Catalog: tracking.init_log_end.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import simulators
from accelerate_ref import Accelerator, AcceleratorState, GradientState, ProjectConfiguration
from accelerate_ref import tracking
from accelerate_ref.tracking import GeneralTracker, JSONLinesTracker, filter_trackers, get_available_trackers
from accelerate_ref.utils import LoggerType, is_tensorboard_available, is_wandb_available


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


def test_jsonl_tracker_writes_config_and_one_line_per_log(tmp_path):
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
    acc = fresh(log_with=[recorder, recorder])
    assert acc.log_with == [recorder], "repeats are dropped"
    acc.init_trackers("run", config={"a": 1})
    acc.log({"x": 1.0}, step=3, log_kwargs={"recorder": {"commit": False}, "other": {"ignored": True}})
    assert acc.get_tracker("recorder") is recorder and acc.get_tracker("recorder", unwrap=True) is recorder.calls
    with pytest.raises(ValueError, match="no started tracker is called 'missing'"):
        acc.get_tracker("missing")
    acc.end_training()
    assert recorder.calls == ["start", ("config", {"a": 1}), ("log", {"x": 1.0}, 3, {"commit": False}), "finish"]


def test_without_trackers_get_tracker_is_a_blank_tracker():
    acc = fresh()
    blank = acc.get_tracker("anything")
    assert type(blank) is GeneralTracker
    blank.log({"x": 1})
    acc.log({"x": 1})


def test_log_with_is_checked_when_the_accelerator_is_created(tmp_path):
    with pytest.raises(ValueError, match="Unsupported logging capability: nonsense"):
        fresh(log_with="nonsense")
    with pytest.raises(ValueError, match="logging_dir"):
        fresh(log_with="jsonl")
    assert filter_trackers(LoggerType.ALL, tmp_path) == get_available_trackers()
    assert "jsonl" in get_available_trackers()
    assert ("tensorboard" in get_available_trackers()) == is_tensorboard_available()
    assert filter_trackers(None) == []


@pytest.mark.skipif(is_wandb_available(), reason="wandb is installed here")
def test_a_tracker_whose_package_is_missing_is_dropped_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="wandb is not installed"):
        assert filter_trackers(["wandb", "jsonl"], tmp_path) == ["jsonl"]


def test_an_installed_tracker_this_reference_lacks_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(tracking, "_is_package_available", lambda name: True)
    with pytest.raises(NotImplementedError, match="mlflow"):
        filter_trackers("mlflow", tmp_path)


def test_incomplete_custom_tracker_is_named():
    class Nameless(GeneralTracker):
        pass

    with pytest.raises(NotImplementedError, match="name, requires_logging_directory, tracker"):
        Nameless()


def test_main_process_only_methods_do_nothing_elsewhere(monkeypatch, tmp_path):
    class Elsewhere:
        is_main_process = False

    tracker = JSONLinesTracker("run", tmp_path)
    monkeypatch.setattr(tracking, "PartialState", Elsewhere)
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


# -- across ranks --------------------------------------------------------------------------


def tracking_on_every_rank(folder: str) -> dict:
    acc = Accelerator(log_with=["jsonl", Recorder()], project_config=ProjectConfiguration(logging_dir=folder))
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
