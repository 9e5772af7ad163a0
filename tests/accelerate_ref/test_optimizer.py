"""`AcceleratedOptimizer` (accelerate_ref.optimizer) where HF 1.15's behaviour is the spec: ``step``'s return,
``zero_grad``, train/eval modes, pickling, moving its state to a device, and the patched ``step``."""

from __future__ import annotations

import pickle

import pytest
import torch

from accelerate_ref import Accelerator
from accelerate_ref.optimizer import AcceleratedOptimizer
from accelerate_ref.scheduler import AcceleratedScheduler
from tests.models import seeded_linear


def test_optimizer_move_to_device_matches_hf() -> None:
    from collections import OrderedDict, namedtuple

    from accelerate import optimizer as hf_optimizer

    from accelerate_ref import optimizer as ref_optimizer

    Pair = namedtuple("Pair", "a b")
    state = OrderedDict(step=torch.tensor(3.0), nested=[Pair(torch.ones(2, dtype=torch.float64), "x"), (1, None)])
    moved = [module.move_to_device(state, torch.device("meta")) for module in (ref_optimizer, hf_optimizer)]
    for got in moved:
        assert type(got) is OrderedDict and type(got["nested"][0]) is Pair and got["nested"][0].b == "x"
        assert got["step"].device.type == got["nested"][0].a.device.type == "meta"
        assert got["nested"][1] == (1, None) and got["nested"][0].a.dtype == torch.float64


def test_patch_optimizer_step_matches_hf() -> None:
    from types import SimpleNamespace

    from accelerate import optimizer as hf_optimizer

    from accelerate_ref import optimizer as ref_optimizer

    records = []
    for module in (ref_optimizer, hf_optimizer):
        holder = SimpleNamespace()
        calls = []
        step = module.patch_optimizer_step(holder, lambda *args, **kwargs: calls.append((args, kwargs)) or "stepped")
        before = hasattr(holder, "_accelerate_step_called")
        records.append((before, step(1, closure=None), holder._accelerate_step_called, calls))
    assert records[0] == records[1] == (False, "stepped", True, [((1,), {"closure": None})])


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_prepared_optimizer_and_scheduler_pickle() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    _, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer_copy = pickle.loads(pickle.dumps(optimizer))
    assert isinstance(optimizer_copy, AcceleratedOptimizer) and optimizer_copy.param_groups[0]["lr"] == 0.25
    assert isinstance(pickle.loads(pickle.dumps(scheduler)), AcceleratedScheduler)


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


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_step_returns_none_even_with_a_closure():
    accelerator = Accelerator(cpu=True)
    model = seeded_linear()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()

    def closure():
        optimizer.zero_grad()
        loss = _loss(model)
        loss.backward()
        return loss

    assert optimizer.step(closure) is None
    assert not torch.equal(model.weight, before), "the closure's gradients were used"


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_zero_grad_refuses_set_to_none_an_optimizer_does_not_take():
    accelerator = Accelerator(cpu=True)
    model = seeded_linear()
    optimizer = accelerator.prepare(_NoSetToNone(model.parameters(), lr=0.1))
    _loss(model).backward()
    with pytest.raises(ValueError, match=r"^`set_to_none` for Optimizer.zero_grad` is not supported by this optimizer.$"):
        optimizer.zero_grad(set_to_none=True)
    optimizer.zero_grad()
    assert torch.count_nonzero(model.weight.grad) == 0


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_train_and_eval_reach_a_wrapped_optimizers_modes():
    wrapper = _Modes(torch.optim.SGD(seeded_linear().parameters(), lr=0.1))
    Accelerator(cpu=True)
    optimizer = AcceleratedOptimizer(wrapper, device_placement=False)
    optimizer.train()
    optimizer.eval()
    assert wrapper.modes == ["train", "eval"]


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_a_scaled_optimizer_pickles_and_its_state_needs_a_scaler():
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    model = seeded_linear()
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
