"""`AcceleratedScheduler` (accelerate_ref.scheduler): steps only with the optimizer's real updates, side by side
with HF accelerate 1.15 at 1 and 2 ranks (LambdaLR, StepLR, OneCycleLR past its ``total_steps``).

Catalog: accumulate.scheduler.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import simulators
from accelerate_ref import Accelerator
from tests.models import seeded_linear
from tests.side_by_side import IMPLS, RANK_ENV, leave_together, observation


def _forget_states() -> None:
    """Both implementations' accelerator and gradient states forgotten (the process group, if any, is kept)."""
    for impl in IMPLS:
        state = importlib.import_module(f"{impl}.state")
        state.AcceleratorState._reset_state()
        state.GradientState._reset_state()


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
            trace.append(observation(prepared.step))
        inner = prepared.scheduler
        trace.append((round(prepared.get_last_lr()[0], 10), inner._step_count, inner.last_epoch))
    return trace


def scheduler_comparison() -> dict:
    """On a rank: every case's trace under both implementations."""
    with warnings.catch_warnings():  # torch's, as the optimizer is stepped through a wrapper, in both
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
        return leave_together({case: {impl: _scheduler_trace(impl, *case) for impl in IMPLS} for case in SCHEDULER_CASES})


def _check_schedulers(report: dict, where: str) -> None:
    for case, traces in report.items():
        assert traces["accelerate_ref"] == traces["accelerate"], (where, case)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_scheduler_steps_as_hfs_at_world_1(fresh_states) -> None:
    report = scheduler_comparison()
    _check_schedulers(report, "world 1")
    # HF's own lambda test: the lr after a step whose optimizer step was skipped is the previous one
    assert report["LambdaLR", False, True, 1, True, (1,)]["accelerate_ref"][1::2][:2] == [(0.9, 2, 1), (0.9, 2, 1)]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
@pytest.mark.slow
def test_scheduler_steps_as_hfs_at_world_2() -> None:
    reports = simulators.run(scheduler_comparison, world=2, timeout=180, env=RANK_ENV)
    for rank, report in enumerate(reports):
        _check_schedulers(report, f"rank {rank} of 2")
    lambda_lr = reports[0]["LambdaLR", False, True, 1, True, (1,)]["accelerate_ref"][1::2]
    assert lambda_lr[:2] == [(0.8, 3, 2), (0.8, 3, 2)]  # one step per process; none when the optimizer's was skipped
    one_cycle = reports[0]["OneCycleLR", False, True, 1, True, ()]["accelerate_ref"][1::2]
    assert [step_count for _, step_count, _ in one_cycle] == [3, 4, 4, 4, 4]  # never stepped past total_steps


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_a_scheduler_without_a_prepared_optimizer_follows_those_prepared_later():
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(seeded_linear().parameters(), lr=1.0)
    scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5))
    later = accelerator.prepare_optimizer(torch.optim.SGD(seeded_linear().parameters(), lr=1.0))
    assert scheduler.optimizers is accelerator._optimizers
    later._is_overflow = True
    scheduler.step()
    assert scheduler.get_last_lr() == [1.0], "a step the later optimizer skipped holds the scheduler"
