"""What a real tracker recorded, read back from the tracker's own store (catalog tracking.init_log_end).

The tracking cases do not trust the implementation's account of what it
logged: they read the store the tracker's package wrote, with that
package's own reader where it has one.

* MLflow: the runs of an experiment in the store at a tracking URI (a local
  file store here), through ``mlflow.MlflowClient``.
* Comet offline experiments (`comet_offline_runs`): each is a zip archive
  in the offline directory holding ``experiment.json`` (the project) and
  ``messages.json`` (one JSON message a line: ``parameter_msg``,
  ``metric_msg``, ...), the files ``comet upload`` sends.
* Aim (`aim_runs`): the runs of an Aim repository, through ``aim.Repo``
  after Aim's own indexer has indexed each run's chunk (what ``aim up``'s
  watcher does; a closed run is invisible to ``Repo`` until then).
* ClearML offline sessions (`clearml_offline_session`): the session folder
  of a task (``task.json``, whose configuration is HOCON text parsed with
  ClearML's own parser, and ``metrics.jsonl``, arrays of events) and the
  zip ClearML writes beside it when the task closes.
* DVCLive (`dvclive_store`): the files ``dvclive.Live`` writes in its
  ``dir``: ``params.yaml`` and one ``plots/metrics/<name>.tsv`` per metric
  (a ``step`` column and the metric's); DVCLive ships no reader of them.
* W&B offline runs: ``wandb`` (0.19 and later) no longer ships a Python
  reader of its run files, so `wandb_offline_runs` reads the framing itself
  and parses each record with wandb's own protobuf ``Record``. A run file
  (``<dir>/wandb/offline-run-*/run-<id>.wandb``) is a 7-byte header
  (``:W&B``, magic 0xBEE1, version 0) and then LevelDB's log format: 32 KiB
  blocks of chunks, each a 7-byte chunk header (masked CRC-32C, length,
  type 1 FULL / 2 FIRST / 3 MIDDLE / 4 LAST) and its bytes; a block tail of
  fewer than 7 bytes is zero padding, and a chunk of type 0 ends the data.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import zipfile
from typing import Any, Iterator

#: Header of a W&B run file: b":W&B", magic 0xBEE1 (little-endian), version 0.
WANDB_HEADER = b":W&B\xe1\xbe\x00"
_BLOCK = 32 * 1024
_CHUNK_HEADER = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def mlflow_runs(tracking_uri: str, experiment_name: str) -> list[dict[str, Any]]:
    """Every run of ``experiment_name`` in the store at ``tracking_uri``, oldest first.

    Each run is ``{"status", "params", "metrics"}``; ``metrics`` maps a key to
    its ``[step, value]`` history in order of step. An absent experiment
    gives ``[]``.
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    return [
        {
            "status": run.info.status,
            "params": dict(run.data.params),
            "metrics": {
                key: sorted([m.step, m.value] for m in client.get_metric_history(run.info.run_id, key))
                for key in run.data.metrics
            },
        }
        for run in runs
    ]


def wandb_offline_runs(wandb_dir: str) -> list[dict[str, Any]]:
    """Every offline run under ``wandb_dir`` (the ``dir``/``WANDB_DIR`` it was started with), by file name.

    Each run is ``{"project", "config", "history", "exited"}``: the config
    as last updated (wandb's own ``_wandb`` key left out), each logged row
    as ``[step, {key: value}]`` without wandb's ``_step``/``_runtime``/
    ``_timestamp``, and whether the run wrote its exit record (``finish``).
    """
    pattern = os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")
    return [_wandb_run(path) for path in sorted(glob.glob(pattern))]


def _wandb_run(path: str) -> dict[str, Any]:
    from wandb.proto import wandb_internal_pb2

    run: dict[str, Any] = {"project": None, "config": {}, "history": [], "exited": False}
    for data in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["project"] = record.run.project
            run["config"].update(_items(record.run.config.update))
        elif kind == "config":
            run["config"].update(_items(record.config.update))
        elif kind == "history":
            row = {key: value for key, value in _items(record.history.item).items() if not key.startswith("_")}
            run["history"].append([record.history.step.num, row])
        elif kind == "exit":
            run["exited"] = True
    run["config"].pop("_wandb", None)
    return run


def _items(items: Any) -> dict[str, Any]:
    """``{key: value}`` of wandb's protobuf items (a nested key joined with "/", values JSON-decoded)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _wandb_records(path: str) -> Iterator[bytes]:
    """The records of a W&B run file (see the module docstring for the format)."""
    with open(path, "rb") as stream:
        data = stream.read()
    if not data.startswith(WANDB_HEADER):
        raise ValueError(f"{path} is not a W&B run file (header {data[:7]!r})")
    position, pending = len(WANDB_HEADER), b""
    while position + _CHUNK_HEADER.size <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _CHUNK_HEADER.size:  # zero padding at a block's end
            position += left_in_block
            continue
        _, length, kind = _CHUNK_HEADER.unpack_from(data, position)
        start = position + _CHUNK_HEADER.size
        chunk, position = data[start : start + length], start + length
        if kind == 0:  # zeros past the last record written (a file not yet fully written)
            return
        if kind in (_FULL, _FIRST):
            pending = chunk
        elif kind in (_MIDDLE, _LAST):
            pending += chunk
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {start - _CHUNK_HEADER.size}")
        if kind in (_FULL, _LAST):
            yield pending


def comet_offline_runs(directory: str) -> list[dict[str, Any]]:
    """Every Comet offline archive in ``directory`` (by file name).

    Each is ``{"project", "params", "metrics"}``: the parameters logged, and
    each metric's ``[step, value]`` history in the order logged (Comet's own
    system metrics included).
    """
    runs = []
    for path in sorted(glob.glob(os.path.join(directory, "*.zip"))):
        with zipfile.ZipFile(path) as archive:
            run: dict[str, Any] = {"project": json.loads(archive.read("experiment.json"))["project_name"], "params": {}, "metrics": {}}
            for line in archive.read("messages.json").decode().splitlines():
                message = json.loads(line)
                if message["type"] == "parameter_msg":
                    run["params"][message["payload"]["param"]["paramName"]] = message["payload"]["param"]["paramValue"]
                elif message["type"] == "metric_msg":
                    metric = message["payload"]["metric"]
                    run["metrics"].setdefault(metric["metricName"], []).append([metric["step"], metric["metricValue"]])
        runs.append(run)
    return runs


def aim_runs(repo_dir: str) -> list[dict[str, Any]]:
    """Every run of the Aim repository at ``repo_dir`` (by hash): ``{"name", "hparams", "metrics", "ended"}``.

    ``metrics`` maps each metric name (Aim's ``__system__`` ones left out)
    to its ``[step, value]`` history; ``ended``: the run was closed.
    """
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    repo = Repo(repo_dir)
    indexer = RepoIndexManager.get_index_manager(repo)
    chunks = os.path.join(repo.path, "meta", "chunks")
    for run_hash in sorted(os.listdir(chunks)):
        indexer.index(run_hash)
    runs = []
    for run in sorted(Repo(repo_dir).iter_runs(), key=lambda run: run.hash):
        metrics = {}
        for metric in run.metrics():
            if not metric.name.startswith("__system__"):
                steps, (values, *_) = metric.data.items_list()
                metrics[metric.name] = [[step, value] for step, value in zip(steps, values)]
        hparams = run.get("hparams", {})
        runs.append({"name": run.name, "hparams": hparams, "metrics": metrics, "ended": run.end_time is not None})
    return runs


def clearml_offline_session(folder: str) -> dict[str, Any]:
    """The ClearML offline session in ``folder``: ``{"project", "task", "configuration", "scalars", "closed"}``.

    ``configuration`` is the connected configuration (section "General");
    ``scalars`` maps ``"title/series"`` to its ``[iteration, value]``
    history (single values under ``"Summary/<name>"`` at iteration None);
    ``closed``: ClearML wrote the session's zip (it does when the task closes).
    """
    from clearml.utilities.pyhocon import ConfigFactory

    with open(os.path.join(folder, "task.json"), encoding="utf-8") as stream:
        task = json.load(stream)
    general = (task.get("configuration") or {}).get("General", {}).get("value", "")
    scalars: dict[str, list] = {}
    metrics_path = os.path.join(folder, "metrics.jsonl")
    lines = open(metrics_path, encoding="utf-8").read().splitlines() if os.path.exists(metrics_path) else []
    for event in (event for line in lines for event in json.loads(line)):
        if event.get("type") == "training_stats_scalar":
            iteration = None if event["iter"] == -(2**31) else event["iter"]
            scalars.setdefault(f"{event['metric']}/{event['variant']}", []).append([iteration, event["value"]])
    return {
        "project": task.get("project_name"),
        "task": task.get("name"),
        "configuration": dict(ConfigFactory.parse_string(general)) if general else {},
        "scalars": scalars,
        "closed": os.path.exists(os.fspath(folder).rstrip(os.sep) + ".zip"),
    }


def dvclive_store(directory: str) -> dict[str, Any]:
    """What DVCLive wrote in ``directory``: ``{"params", "metrics"}``, each metric as its ``[step, value]`` rows.

    An absent ``directory`` (nothing written) gives ``{"params": None, "metrics": {}}``.
    """
    import yaml

    params_path = os.path.join(directory, "params.yaml")
    params = None
    if os.path.exists(params_path):
        with open(params_path, encoding="utf-8") as stream:
            params = yaml.safe_load(stream)
    metrics = {}
    for path in sorted(glob.glob(os.path.join(directory, "plots", "metrics", "*.tsv"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path, encoding="utf-8", newline="") as stream:
            metrics[name] = [[int(row["step"]), float(row[name])] for row in csv.DictReader(stream, delimiter="\t")]
    return {"params": params, "metrics": metrics}
