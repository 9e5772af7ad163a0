"""Catalog section "Tracking".

A custom `GeneralTracker` (built on the implementation's own base class)
records every call it receives in its process; each rank returns what its
tracker saw, and the driver checks that only the main process's tracker
was started, configured, logged to and finished.

The same rule with the real trackers whose packages are installed (extra
``trackers``: ``log_with="mlflow"`` and ``log_with="wandb"`` (offline);
extra ``trackers-more``: ``"comet_ml"`` (offline), ``"aim"`` (a local
repository), ``"clearml"`` (offline mode), ``"dvclive"`` (local files)), on
every rank; once every rank has ended, the main process reads back the
tracker's own store (`conformance.support.tracker_stores`) and the driver checks
that it holds one run, with the configuration and each value at its step.
Without the package the case is NOT_SUPPORTED.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Callable, Optional

from ..engine.case import NotSupported, case
from ..support.checks import expect_equal, expect_ranks, expect_true
from ..support.training import fresh_rendezvous

CONFIG = {"learning_rate": 0.1, "batch_size": 2}
LOGGED = [({"loss": 0.5}, 1), ({"loss": 0.25, "accuracy": 0.75}, 2)]


def _recorder_class(impl):
    """A `GeneralTracker` subclass of the implementation that records the calls made to it."""

    class Recorder(impl.part("tracking").GeneralTracker):
        name = "recorder"
        requires_logging_directory = False

        def __init__(self) -> None:
            super().__init__()
            self.calls: list = []

        @property
        def tracker(self):
            return self.calls

        def start(self) -> None:
            self.calls.append(["start"])

        def store_init_configuration(self, values: dict) -> None:
            self.calls.append(["config", dict(values)])

        def log(self, values: dict, step=None, **kwargs) -> None:
            self.calls.append(["log", dict(values), step])

        def finish(self) -> None:
            self.calls.append(["finish"])

    return Recorder


def _reopen_process_group(impl, world, had_group: bool) -> None:
    """`end_training` may tear the process group down; the rank pool runs later cases in it, so build it again
    (on a fresh port, as the kwargs.init_process_group case does)."""

    import torch.distributed as dist

    if not had_group or dist.is_initialized():
        return
    fresh_rendezvous(world)
    impl.reset()
    impl.Accelerator()
    expect_true(dist.is_initialized(), "the process group could not be built again after end_training()")


@case("tracking.init_log_end")
def tracking_init_log_end(impl, world):
    """``log_with=<custom GeneralTracker>``, ``init_trackers(project, config)``, ``log(values, step)``,
    ``end_training()``: only the main process's tracker is started, configured, logged to and finished;
    ``get_tracker(name)`` returns it there (``unwrap=True`` its ``tracker`` object), and elsewhere a tracker
    whose methods do nothing."""
    import torch.distributed as dist

    recorder = _recorder_class(impl)()
    acc = impl.Accelerator(log_with=recorder)
    acc.init_trackers("conformance", config=CONFIG)
    found = acc.get_tracker("recorder")
    found_is_recorder = found is recorder
    unwrapped_is_calls = acc.get_tracker("recorder", unwrap=True) is recorder.calls
    if not found_is_recorder:
        found.log({"ignored": 1.0}, step=0)  # the stand-in of the other processes must accept calls
    for values, step in LOGGED:
        acc.log(values, step=step)
    had_group = dist.is_initialized()
    acc.end_training()
    _reopen_process_group(impl, world, had_group)
    return {"calls": recorder.calls, "found": found_is_recorder, "unwrapped": unwrapped_is_calls}


@tracking_init_log_end.check
def _only_main_tracks(values, world):
    main = [rank == 0 for rank in range(world.size)]
    expect_ranks([v["found"] for v in values], main, "get_tracker('recorder') returned the custom tracker")
    expect_ranks([v["unwrapped"] for v in values], main, "get_tracker('recorder', unwrap=True) returned its tracker object")
    expected = [["start"], ["config", CONFIG]] + [["log", values, step] for values, step in LOGGED] + [["finish"]]
    expect_equal(values[0]["calls"], expected, "calls the main process's tracker received")
    others = {rank: v["calls"] for rank, v in enumerate(values) if rank and v["calls"]}
    expect_equal(others, {}, "calls received by the trackers of other processes")


#: Worlds of the real-tracker cases: the rule (only the main process writes) shows at 2.
TRACKER_WORLDS = ("2",)
#: Seconds a real-tracker case may take: importing mlflow or starting wandb's service takes seconds on a busy machine.
TRACKER_CASE_TIMEOUT = 60.0
#: No telemetry, no git or code capture, no console output: offline only.
QUIET = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_CONSOLE": "off",  # leave the rank's stdout and stderr alone
}


def _require(package: str, extra: str = "trackers") -> None:
    """NOT_SUPPORTED unless ``package`` is installed."""
    if importlib.util.find_spec(package) is None:
        raise NotSupported(f"the {package} package is not installed (pip install .[{extra}])")


def _track_with(
    impl, world, name: str, read_store: Callable[[Any], Any], init_kwargs: Optional[dict] = None, **accelerator_kwargs: Any
) -> Any:
    """``log_with=name`` on every rank: init with CONFIG (and ``init_kwargs``), log LOGGED, end; after every rank
    ended, the main process returns ``read_store(tracker object)`` (the others None)."""
    import torch.distributed as dist

    acc = impl.Accelerator(log_with=name, **accelerator_kwargs)
    acc.init_trackers("conformance", config=CONFIG, init_kwargs=init_kwargs)
    for values, step in LOGGED:
        acc.log(values, step=step)
    tracker = acc.get_tracker(name, unwrap=True)
    had_group = dist.is_initialized()
    acc.end_training()
    _reopen_process_group(impl, world, had_group)
    if dist.is_initialized():
        dist.barrier()  # every rank has ended its trackers before the store is read
    return read_store(tracker) if world.rank == 0 else None


def _logged_metrics() -> dict[str, list]:
    """Each key of LOGGED with its ``[step, value]`` history."""
    metrics: dict = {}
    for logged, step in LOGGED:
        for key, value in logged.items():
            metrics.setdefault(key, []).append([step, value])
    return metrics


@case("tracking.init_log_end", worlds=TRACKER_WORLDS, env=QUIET, timeout=TRACKER_CASE_TIMEOUT)
def tracking_mlflow(impl, world):
    """``log_with="mlflow"`` with a local file store (``MLFLOW_TRACKING_URI``): the experiment named after the
    project holds one finished run, with the configuration as parameters and each metric at its step."""
    _require("mlflow")
    from ..support.tracker_stores import mlflow_runs

    uri = "file:" + os.path.join(world.shared_dir, "mlruns")
    os.environ.update(MLFLOW_TRACKING_URI=uri, MLFLOW_ALLOW_FILE_STORE="true")  # the worker restores os.environ
    try:
        return _track_with(impl, world, "mlflow", lambda tracker: mlflow_runs(uri, "conformance"))
    finally:
        _end_mlflow_runs()


def _end_mlflow_runs() -> None:
    """End any MLflow run left active in this rank (a broken tracker's), so later cases start clean."""
    mlflow = sys.modules.get("mlflow")  # not imported here: no run to end
    while mlflow is not None and mlflow.active_run() is not None:
        mlflow.end_run()


@tracking_mlflow.check
def _one_mlflow_run(values, world):
    params = {key: str(value) for key, value in CONFIG.items()}
    expected = [{"status": "FINISHED", "params": params, "metrics": _logged_metrics()}]
    expect_equal(values[0], expected, "runs of experiment 'conformance' in the MLflow store (one, from the main process)")


@case("tracking.init_log_end", worlds=TRACKER_WORLDS, env=QUIET, timeout=TRACKER_CASE_TIMEOUT)
def tracking_wandb(impl, world):
    """``log_with="wandb"`` in offline mode (``WANDB_DIR``): one offline run of the project, with the
    configuration, one history row per ``log`` at its step, and its exit record."""
    _require("wandb")
    os.environ["WANDB_DIR"] = world.shared_dir  # the worker restores os.environ
    try:
        return _track_with(impl, world, "wandb", lambda tracker: _wandb_runs_after_teardown(world.shared_dir))
    finally:
        _teardown_wandb()


def _wandb_runs_after_teardown(directory: str) -> list:
    _teardown_wandb()  # its service has written and closed the run files
    from ..support.tracker_stores import wandb_offline_runs

    return wandb_offline_runs(directory)


def _teardown_wandb() -> None:
    """Stop this rank's wandb service (it outlives runs), so no process is left behind."""
    wandb = sys.modules.get("wandb")  # not imported here: no service started
    if wandb is not None:
        wandb.teardown()


@tracking_wandb.check
def _one_wandb_run(values, world):
    expected = [{"project": "conformance", "config": CONFIG, "history": [[s, v] for v, s in LOGGED], "exited": True}]
    expect_equal(values[0], expected, "offline W&B runs under WANDB_DIR (one, from the main process)")


def _only_logged(run: dict, params: str, metrics: str) -> dict:
    """``run`` with its ``params`` and ``metrics`` entries cut to the keys of CONFIG and LOGGED (a tracker's
    own extras, such as system metrics, left out)."""
    keys = {key for logged, _ in LOGGED for key in logged}
    return {**run, params: {k: v for k, v in run[params].items() if k in CONFIG},
            metrics: {k: v for k, v in run[metrics].items() if k in keys}}


@case("tracking.init_log_end", worlds=TRACKER_WORLDS, env=QUIET, timeout=TRACKER_CASE_TIMEOUT)
def tracking_comet_ml(impl, world):
    """``log_with="comet_ml"`` offline (``init_kwargs={"comet_ml": {"online": False}}``, archives in
    ``COMET_OFFLINE_DIRECTORY``): one archive, of the project, with the configuration as parameters and each
    metric at its step."""
    _require("comet_ml", extra="trackers-more")
    from ..support.tracker_stores import comet_offline_runs

    directory = os.path.join(world.shared_dir, "comet")
    os.environ["COMET_OFFLINE_DIRECTORY"] = directory  # the worker restores os.environ
    runs = _track_with(impl, world, "comet_ml", lambda tracker: comet_offline_runs(directory),
                       init_kwargs={"comet_ml": {"online": False}})
    return None if runs is None else [_only_logged(run, "params", "metrics") for run in runs]


@tracking_comet_ml.check
def _one_comet_archive(values, world):
    expected = [{"project": "conformance", "params": CONFIG, "metrics": _logged_metrics()}]
    expect_equal(values[0], expected, "Comet offline archives (one, from the main process)")


#: Aim without its system-metrics thread, terminal capture or environment snapshot.
AIM_QUIET = {"aim": {"system_tracking_interval": None, "capture_terminal_logs": False, "log_system_params": False}}


@case("tracking.init_log_end", worlds=TRACKER_WORLDS, env=QUIET, timeout=TRACKER_CASE_TIMEOUT)
def tracking_aim(impl, world):
    """``log_with="aim"`` with ``project_dir=<dir>``: the Aim repository there holds one closed run, named after
    the project, with the configuration as its ``hparams`` and each metric at its step."""
    _require("aim", extra="trackers-more")
    from ..support.tracker_stores import aim_runs

    directory = os.path.join(world.shared_dir, "aim")
    return _track_with(impl, world, "aim", lambda tracker: aim_runs(directory), init_kwargs=AIM_QUIET,
                       project_dir=directory)


@tracking_aim.check
def _one_aim_run(values, world):
    expected = [{"name": "conformance", "hparams": CONFIG, "metrics": _logged_metrics(), "ended": True}]
    expect_equal(values[0], expected, "runs of the Aim repository (one, from the main process)")


#: ClearML without its framework hooks, resource monitor, console capture or argparse capture.
CLEARML_QUIET = {"clearml": {"auto_connect_frameworks": False, "auto_resource_monitoring": False,
                             "auto_connect_streams": False, "auto_connect_arg_parser": False}}


@case("tracking.init_log_end", worlds=TRACKER_WORLDS, env=QUIET, timeout=TRACKER_CASE_TIMEOUT)
def tracking_clearml(impl, world):
    """``log_with="clearml"`` in offline mode (``CLEARML_OFFLINE_MODE=1``): the task's offline session is of the
    project, holds the configuration and each metric at its step (series "train"), and was closed. Only the
    main process creates a task (ClearML's sessions are read from the main process's task only; the other
    ranks must not have started one)."""
    _require("clearml", extra="trackers-more")
    from ..support.tracker_stores import clearml_offline_session

    config_file = os.path.join(world.shared_dir, f"clearml-{world.rank}.conf")
    with open(config_file, "w", encoding="utf-8") as stream:
        stream.write("sdk.development.report_use_subprocess: false\n")  # report from a thread: no child process
    os.environ.update(  # the worker restores os.environ
        CLEARML_OFFLINE_MODE="1", CLEARML_CONFIG_FILE=config_file, HOME=world.shared_dir,
        CLEARML_CACHE_DIR=os.path.join(world.shared_dir, f"clearml-cache-{world.rank}"),
    )
    session = _track_with(impl, world, "clearml", lambda task: clearml_offline_session(task.get_offline_mode_folder()),
                          init_kwargs=CLEARML_QUIET)
    others = os.path.join(world.shared_dir, f"clearml-cache-{world.rank}", "offline")
    started_here = sorted(os.listdir(others)) if os.path.isdir(others) else []
    return {"session": session, "sessions_started": len([name for name in started_here if not name.endswith(".zip")])}


@tracking_clearml.check
def _one_clearml_session(values, world):
    expect_ranks([v["sessions_started"] for v in values], [1 if rank == 0 else 0 for rank in range(world.size)],
                 "ClearML offline sessions each rank started")
    scalars = {f"{key}/train": history for key, history in _logged_metrics().items()}
    expected = {"project": "conformance", "task": "conformance", "configuration": CONFIG, "scalars": scalars, "closed": True}
    expect_equal(values[0]["session"], expected, "the main process's ClearML offline session")


@case("tracking.init_log_end", worlds=TRACKER_WORLDS, env=QUIET, timeout=TRACKER_CASE_TIMEOUT)
def tracking_dvclive(impl, world):
    """``log_with="dvclive"`` with ``init_kwargs={"dvclive": {"dir": <dir>, ...}}``: DVCLive's files there hold
    the configuration as ``params.yaml`` and each metric at its step. Only the main process writes: each rank
    is given its own ``dir``, and the others' stay empty."""
    _require("dvclive", extra="trackers-more")
    from ..support.tracker_stores import dvclive_store

    mine = os.path.join(world.shared_dir, f"dvclive-{world.rank}")
    options = {"dvclive": {"dir": mine, "save_dvc_exp": False, "dvcyaml": None}}  # no dvc.yaml, no DVC experiment
    # DVCLive runs `dvc init` in the Git repository around the working directory: work outside any.
    here = os.getcwd()
    os.chdir(world.shared_dir)
    try:
        _track_with(impl, world, "dvclive", lambda live: None, init_kwargs=options)
    finally:
        os.chdir(here)
    return dvclive_store(mine)


@tracking_dvclive.check
def _dvclive_files(values, world):
    expected = [{"params": CONFIG, "metrics": _logged_metrics()}] + [{"params": None, "metrics": {}}] * (world.size - 1)
    expect_equal(values, expected, "what DVCLive wrote in each rank's dir (only the main process's holds anything)")
