"""AcceleratedOptimizer and AcceleratedScheduler where HF 1.15's behaviour is the spec (measured by the
differential probes ``optimizer.*`` and ``scheduler.*``): return values, refusals and their texts, pickling.

Catalog: accumulate.scheduler, autocast.fp16_scaler.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from accelerate_ref import Accelerator
from accelerate_ref.optimizer import AcceleratedOptimizer

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _loss(model: torch.nn.Module) -> torch.Tensor:
    return model(torch.arange(6.0).view(2, 3)).pow(2).mean()


class _NoSetToNone(torch.optim.SGD):
    def zero_grad(self) -> None:
        super().zero_grad(set_to_none=False)


class _Modes:
    """A wrapper (as DeepSpeed's) whose inner optimizer has train/eval."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.optimizer = inner
        self.modes: list[str] = []
        inner.train = lambda: self.modes.append("train")
        inner.eval = lambda: self.modes.append("eval")


def test_step_returns_none_even_with_a_closure():
    accelerator = Accelerator(cpu=True)
    model = _model()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()

    def closure():
        optimizer.zero_grad()
        loss = _loss(model)
        loss.backward()
        return loss

    assert optimizer.step(closure) is None
    assert not torch.equal(model.weight, before), "the closure's gradients were used"


def test_zero_grad_refuses_set_to_none_an_optimizer_does_not_take():
    accelerator = Accelerator(cpu=True)
    model = _model()
    optimizer = accelerator.prepare(_NoSetToNone(model.parameters(), lr=0.1))
    _loss(model).backward()
    with pytest.raises(ValueError, match=r"^`set_to_none` for Optimizer.zero_grad` is not supported by this optimizer.$"):
        optimizer.zero_grad(set_to_none=True)
    optimizer.zero_grad()
    assert torch.count_nonzero(model.weight.grad) == 0


def test_train_and_eval_reach_a_wrapped_optimizers_modes():
    wrapper = _Modes(torch.optim.SGD(_model().parameters(), lr=0.1))
    Accelerator(cpu=True)
    optimizer = AcceleratedOptimizer(wrapper, device_placement=False)
    optimizer.train()
    optimizer.eval()
    assert wrapper.modes == ["train", "eval"]


def test_a_scaled_optimizer_pickles_and_its_state_needs_a_scaler():
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    model = _model()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(_loss(model))
    optimizer.step()
    assert "_accelerate_step_called" not in optimizer.__getstate__()
    copy = pickle.loads(pickle.dumps(optimizer))
    assert copy.scaler is not None and copy.param_groups[0]["lr"] == 0.1
    with pytest.raises(AttributeError, match="no attribute 'scaler'"):
        AcceleratedOptimizer.__new__(AcceleratedOptimizer).__setstate__({"optimizer": optimizer.optimizer})
    with pytest.raises(AttributeError, match="no attribute 'step'"):
        AcceleratedOptimizer(object(), device_placement=False, scaler=accelerator.scaler)


def test_a_scheduler_without_a_prepared_optimizer_follows_those_prepared_later():
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(_model().parameters(), lr=1.0)
    scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5))
    later = accelerator.prepare_optimizer(torch.optim.SGD(_model().parameters(), lr=1.0))
    assert scheduler.optimizers is accelerator._optimizers
    later._is_overflow = True
    scheduler.step()
    assert scheduler.get_last_lr() == [1.0], "a step the later optimizer skipped holds the scheduler"
