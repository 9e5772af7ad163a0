"""Behaviours a switched script meets, measured on HF accelerate 1.15 and accelerate_ref side by side (issue 20, item 4).

Each test runs the same thing against both implementations and asserts
they agree: the launchers with a ``functools.partial``; what a prepared
data loader is to ``isinstance`` and to attribute access (classes, the
AttributeErrors and their texts), stateful or not, at 1 and 2 ranks; and
how a prepared scheduler steps (LambdaLR, StepLR, OneCycleLR past its
``total_steps``) with and without ``split_batches``, gradient accumulation
and skipped optimizer steps, at 1 and 2 ranks. Where accelerate_ref
deliberately differs, `LOADER_DEVIATIONS` says what and why.

Catalog: accumulate.scheduler, launch.debug_launcher, launch.notebook_launcher, data.skip_first_batches.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import simulators
from accelerate_ref.utils import is_torchdata_stateful_dataloader_available
from accelerate_ref.utils._other.ports import get_free_port

IMPLS = ("accelerate", "accelerate_ref")
RANK_ENV = {"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
needs_torchdata = pytest.mark.skipif(not is_torchdata_stateful_dataloader_available(), reason="torchdata is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


def _forget_states() -> None:
    """Both implementations' accelerator and gradient states forgotten (the process group, if any, is kept)."""
    for impl in IMPLS:
        state = importlib.import_module(f"{impl}.state")
        state.AcceleratorState._reset_state()
        state.GradientState._reset_state()


def _leave_together(report: dict) -> dict:
    """``report``, once every rank is done: a rank leaving (closing its connections) while another is still
    receiving its last broadcast would fail that one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return report


@pytest.fixture
def fresh_states():
    def forget_all() -> None:
        for impl in IMPLS:
            state = importlib.import_module(f"{impl}.state")
            state.AcceleratorState._reset_state(True)
            state.GradientState._reset_state()

    forget_all()
    yield
    forget_all()


# -- launchers: any callable ---------------------------------------------------------------------

_LAUNCH_SCRIPT = textwrap.dedent('''
    import functools, importlib, os, sys
    from pathlib import Path

    def record(folder, tag, value):
        import torch.distributed as dist

        if dist.is_initialized():  # debug_launcher's ranks (HF's and ours): one that returned at once could
            dist.barrier()         # close its gloo pair while the other still connects ("Connection closed by peer")
        Path(folder, f"{os.getpid()}.txt").write_text(f"{tag} {value}")

    root, port = sys.argv[1:3]
    for impl, launcher in (argument.split(":") for argument in sys.argv[3:]):
        folder = Path(root, f"{impl}-{launcher}")
        folder.mkdir()
        options = {"use_port": port} if launcher == "notebook_launcher" else {}
        try:
            launch = getattr(importlib.import_module(f"{impl}.launchers"), launcher)
            launch(functools.partial(record, folder, "partial"), args=(3,), num_processes=2, **options)
        except Exception as error:
            print(impl, launcher, f"{type(error).__name__}: {error}")
''')


def test_launchers_take_a_partial(tmp_path: Path) -> None:
    """``debug_launcher(functools.partial(...))`` runs on both ranks as HF's does; so does ``notebook_launcher``'s,
    where HF 1.15 hands the partial to torch's elastic agent, which fails on its missing ``__name__``."""
    launches = ["accelerate:debug_launcher", "accelerate_ref:debug_launcher", "accelerate_ref:notebook_launcher"]
    run = subprocess.run([sys.executable, "-c", _LAUNCH_SCRIPT, str(tmp_path), str(get_free_port()), *launches],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    failures = [line for line in run.stdout.splitlines() if not line.startswith("Launching training on")]
    assert failures == [], "a launcher refused the partial"
    for launch in launches:
        records = sorted(path.read_text() for path in (tmp_path / launch.replace(":", "-")).iterdir())
        assert records == ["partial 3", "partial 3"], launch


# -- prepared loaders: classes and attributes -----------------------------------------------------


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(7))


#: Attributes read on every prepared loader; a missing one is compared by its AttributeError's text.
_ATTRIBUTES = ("dataset", "batch_size", "sampler", "batch_sampler", "total_batch_size", "total_dataset_length",
               "use_stateful_dataloader", "end_of_dataloader", "remainder", "drop_last", "iteration", "device",
               "split_batches", "_drop_last", "dl_state_dict", "no_such_attribute")

#: (loader, attribute) -> why accelerate_ref keeps a value where HF 1.15 raises or differs (HF's own bugs).
LOADER_DEVIATIONS = {
    ("dispatcher", "total_batch_size"): "HF reads dataset.batch_size, which a user's dataset lacks: AttributeError; "
                                        "accelerate_ref gives the documented global batch size",
    ("DataLoaderDispatcher", "total_batch_size"): "as for the dispatcher",
    ("skip(shard)", "total_batch_size"): "HF's SkipBatchSampler has no batch_size: AttributeError; accelerate_ref "
                                         "gives the documented global batch size",
    ("skip(dispatcher)", "total_batch_size"): "as for skip(shard)",
    ("skip(dispatcher)", "batch_sampler"): "HF skips batches of the user's loader, not steps (misaligned at 2 ranks); "
                                           "accelerate_ref skips steps and loads them for the padding",
    ("skip(dispatcher)", "batches"): "as for its batch_sampler (they agree at 1 rank)",
    ("stream shard", "total_batch_size"): "at 2 ranks HF gives the per-process size (its default BatchSampler's); "
                                          "accelerate_ref gives the documented global one",
}


def _observed(value: Callable[[], Any]) -> Any:
    """A plain value, a type name for an object, or ``!Error: text`` for what it raises."""
    try:
        result = value()
    except Exception as error:  # the exception is the observation
        return f"!{type(error).__name__}: {error}"
    if result is None or isinstance(result, (bool, int, float, str)):
        return result
    return f"<{result.__name__}>" if isinstance(result, type) else f"<{type(result).__name__}>"


def _loaders(impl: str, stateful: bool) -> dict[str, DataLoader]:
    data_loader = importlib.import_module(f"{impl}.data_loader")
    importlib.import_module(f"{impl}.state").PartialState(cpu=True)
    option = {"use_stateful_dataloader": True} if stateful else {}
    shard = data_loader.prepare_data_loader(DataLoader(list(range(10)), batch_size=2), **option)
    dispatcher = data_loader.prepare_data_loader(DataLoader(list(range(10)), batch_size=2), dispatch_batches=True,
                                                 put_on_device=True, **option)
    return {
        "shard": shard,
        "dispatcher": dispatcher,
        "stream shard": data_loader.prepare_data_loader(DataLoader(_Stream(), batch_size=2), **option),
        "skip(shard)": data_loader.skip_first_batches(shard, 1),
        "skip(dispatcher)": data_loader.skip_first_batches(dispatcher, 1),
        "skip(stream)": data_loader.skip_first_batches(DataLoader(_Stream(), batch_size=2), 1),
        "SkipDataLoader": data_loader.SkipDataLoader(list(range(10)), batch_size=2, skip_batches=1, **option),
        "DataLoaderShard": data_loader.DataLoaderShard(list(range(10)), batch_size=2, **option),
        "DataLoaderDispatcher": data_loader.DataLoaderDispatcher(list(range(10)), batch_size=2, **option),
    }


def _loader_observations(impl: str, stateful: bool) -> dict[tuple[str, str], Any]:
    """(loader, what) -> what a user sees of ``impl``'s prepared loaders."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data_loader = importlib.import_module(f"{impl}.data_loader")
    seen: dict[tuple[str, str], Any] = {}
    for name, loader in _loaders(impl, stateful).items():
        classes = ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader", "DataLoaderStateMixin", "DataLoaderAdapter")
        for cls in [DataLoader, StatefulDataLoader] + [getattr(data_loader, cls) for cls in classes]:
            seen[name, f"isinstance {cls.__name__}"] = isinstance(loader, cls)
        seen[name, "type"] = type(loader).__name__
        seen[name, "__class__"] = loader.__class__.__name__
        seen[name, "class.base_dataloader"] = _observed(lambda: type(loader).base_dataloader)
        for attribute in _ATTRIBUTES:
            seen[name, attribute] = _observed(lambda: getattr(loader, attribute))
        seen[name, "base_dataloader"] = _observed(lambda: type(loader.base_dataloader))
        seen[name, "len"] = _observed(lambda: len(loader))
        seen[name, "set_epoch"] = _observed(lambda: loader.set_epoch(0))
        seen[name, "pickled"] = _observed(lambda: type(pickle.loads(pickle.dumps(loader))))
        seen[name, "batches"] = _observed(lambda: str([batch.tolist() for batch in loader]))
    return seen


def _loader_differences(hf: dict, ref: dict) -> dict:
    """Where the observations differ, deliberate deviations left out."""
    return {key: (hf[key], ref[key]) for key in hf if hf[key] != ref[key] and key not in LOADER_DEVIATIONS}


def loader_comparison() -> dict:
    """On a rank: every observation of both implementations, stateful or not."""
    return _leave_together({stateful: {impl: _loader_observations(impl, stateful) for impl in IMPLS}
                            for stateful in (False, True)})


@needs_torchdata
def test_prepared_loaders_are_what_hfs_are_at_world_1(fresh_states) -> None:
    for stateful, seen in loader_comparison().items():
        assert _loader_differences(seen["accelerate"], seen["accelerate_ref"]) == {}, f"stateful={stateful}"
        ref = seen["accelerate_ref"]
        for name in ("shard", "dispatcher", "SkipDataLoader", "DataLoaderShard", "DataLoaderDispatcher"):
            assert ref[name, "isinstance StatefulDataLoader"] is stateful and ref[name, "isinstance DataLoader"], name
            assert ref[name, "class.base_dataloader"] == (
                f"!AttributeError: type object '{ref[name, 'type']}' has no attribute 'base_dataloader'"), name
        base = "StatefulDataLoader" if stateful else "DataLoader"
        assert ref["shard", "no_such_attribute"] == f"!AttributeError: '{base}' object has no attribute 'no_such_attribute'"
        assert ref["dispatcher", "device"].startswith("!AttributeError")
        if not stateful:  # a StatefulDataLoader holds an iterator from the start, which pickles in neither
            assert ref["shard", "pickled"] == "<DataLoaderShard>" and ref["SkipDataLoader", "pickled"] == "<SkipDataLoader>"


@needs_torchdata
@pytest.mark.slow
def test_prepared_loaders_are_what_hfs_are_at_world_2() -> None:
    for rank, report in enumerate(simulators.run(loader_comparison, world=2, timeout=180, env=RANK_ENV)):
        for stateful, seen in report.items():
            assert _loader_differences(seen["accelerate"], seen["accelerate_ref"]) == {}, (rank, stateful)


# -- the prepared scheduler ------------------------------------------------------------------------

_SCHEDULERS = {
    "LambdaLR": lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda n: 1 - n / 10),
    "StepLR": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5),
    "OneCycleLR": lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=3),
}
#: (scheduler, split_batches, step_scheduler_with_optimizer, accumulation steps, adjust_scheduler, skipped steps)
SCHEDULER_CASES = [
    (scheduler, split, True, steps, adjust, skipped)
    for scheduler in _SCHEDULERS
    for split in (False, True)
    for steps, adjust in ((1, True), (2, True), (2, False))
    for skipped in ((), (1,))
] + [(scheduler, split, False, 2, True, (1,)) for scheduler in _SCHEDULERS for split in (False, True)]


def _scheduler_trace(impl: str, scheduler: str, split: bool, with_optimizer: bool, steps: int, adjust: bool,
                     skipped: tuple) -> list:
    """(lr, _step_count, last_epoch) after each of 5 batches, or the error; the optimizer's step reads as skipped
    (HF's ``_is_overflow``, as HF's own scheduler tests set it) at the batches in ``skipped``."""
    _forget_states()
    package = importlib.import_module(impl)
    accelerator = package.Accelerator(
        cpu=True, step_scheduler_with_optimizer=with_optimizer,
        gradient_accumulation_plugin=package.utils.GradientAccumulationPlugin(num_steps=steps, adjust_scheduler=adjust),
        dataloader_config=package.DataLoaderConfiguration(split_batches=split),
    )
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, _SCHEDULERS[scheduler](optimizer))
    trace: list = []
    for batch in range(5):
        with accelerator.accumulate(model):
            optimizer.step()
            optimizer._is_overflow = batch in skipped
            trace.append(_observed(prepared.step))
        inner = prepared.scheduler
        trace.append((round(prepared.get_last_lr()[0], 10), inner._step_count, inner.last_epoch))
    return trace


def scheduler_comparison() -> dict:
    """On a rank: every case's trace under both implementations."""
    with warnings.catch_warnings():  # torch's, as the optimizer is stepped through a wrapper, in both
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
        return _leave_together({case: {impl: _scheduler_trace(impl, *case) for impl in IMPLS} for case in SCHEDULER_CASES})


def _check_schedulers(report: dict, where: str) -> None:
    for case, traces in report.items():
        assert traces["accelerate_ref"] == traces["accelerate"], (where, case)


def test_scheduler_steps_as_hfs_at_world_1(fresh_states) -> None:
    report = scheduler_comparison()
    _check_schedulers(report, "world 1")
    # HF's own lambda test: the lr after a step whose optimizer step was skipped is the previous one
    assert report["LambdaLR", False, True, 1, True, (1,)]["accelerate_ref"][1::2][:2] == [(0.9, 2, 1), (0.9, 2, 1)]


@pytest.mark.slow
def test_scheduler_steps_as_hfs_at_world_2() -> None:
    reports = simulators.run(scheduler_comparison, world=2, timeout=180, env=RANK_ENV)
    for rank, report in enumerate(reports):
        _check_schedulers(report, f"rank {rank} of 2")
    lambda_lr = reports[0]["LambdaLR", False, True, 1, True, (1,)]["accelerate_ref"][1::2]
    assert lambda_lr[:2] == [(0.8, 3, 2), (0.8, 3, 2)]  # one step per process; none when the optimizer's was skipped
    one_cycle = reports[0]["OneCycleLR", False, True, 1, True, ()]["accelerate_ref"][1::2]
    assert [step_count for _, step_count, _ in one_cycle] == [3, 4, 4, 4, 4]  # never stepped past total_steps
