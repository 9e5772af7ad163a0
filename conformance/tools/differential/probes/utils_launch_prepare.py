"""Probes of ``accelerate.utils.launch``'s ``PrepareForLaunch``: the per-rank entry point of a fork-based launch
(``notebook_launcher``, ``debug_launcher``), which sets the rank's environment and calls the function.

The debug path (joining a gloo group over a file store) is not called here: it would start a process group in
the driver; the conformance case ``launch.debug_launcher`` runs it.
"""

from __future__ import annotations

import os

from ..probe import Api, probe

AREA = "utils.launch"


def _record_environment(log: list, tag: str) -> None:
    log.append([tag, {name: os.environ.get(name) for name in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED")}])


@probe(AREA)
def prepare_for_launch(api: Api) -> None:
    prepare = "utils.launch.PrepareForLaunch"
    log: list = []
    for distributed_type in ("MULTI_CPU", "MULTI_GPU", "NO", "XLA"):
        launcher = api.call(f"{distributed_type}: build", prepare, _record_environment, distributed_type)
        api.observe(f"{distributed_type}: attributes", lambda: [launcher.launcher is _record_environment,
                                                                 launcher.distributed_type, launcher.debug])
        os.environ.update(NPROC="3", NODE_RANK="1")
        for name in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED"):
            os.environ.pop(name, None)
        api.observe(f"{distributed_type}: rank 2", launcher, 2, log, distributed_type)
    os.environ.pop("NPROC")
    os.environ.pop("NODE_RANK")
    api.observe("MULTI_CPU without NPROC or NODE_RANK", api.get(prepare)(_record_environment, "MULTI_CPU"), 1, log,
                "no NPROC")
    api.call("a DistributedType member", prepare, _record_environment, api.get("utils.DistributedType").MULTI_NPU)
    api.call("an unknown distributed type", prepare, _record_environment, "MULTI_TPU")
    api.call("a lower-case distributed type", prepare, _record_environment, "multi_cpu")
    api.record("what the function saw", log)
