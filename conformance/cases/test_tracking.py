"""Catalog section "Tracking".

A custom `GeneralTracker` (built on the implementation's own base class)
records every call it receives in its process; each rank returns what its
tracker saw, and the driver checks that only the main process's tracker
was started, configured, logged to and finished.
"""

from __future__ import annotations

from ..case import case
from ..checks import expect_equal, expect_ranks, expect_true
from .test_training import _agreed_free_port

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
    import os

    import torch.distributed as dist

    if not had_group or dist.is_initialized():
        return
    os.environ["MASTER_PORT"] = str(_agreed_free_port(world))  # the worker restores the environment after the case
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
