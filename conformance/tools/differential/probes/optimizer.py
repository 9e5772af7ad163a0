"""Probes of ``accelerate.optimizer``: ``move_to_device``, ``patch_optimizer_step`` and ``AcceleratedOptimizer``
(construction, ``step`` with and without a closure, ``zero_grad``, state dicts, the wrapped optimizer's
attributes, ``train``/``eval``, pickling, and the skipped-step logic of fp16's gradient scaler on the mock GPU).

The model is a seeded ``Linear(3, 2)``; weights, gradients and optimizer states are compared exactly.
"""

from __future__ import annotations

import collections
import pickle
from types import SimpleNamespace

import torch

from ..probe import Api, probe

AREA = "optimizer"
CLASS = "optimizer.AcceleratedOptimizer"
Pair = collections.namedtuple("Pair", "first second")


def _model() -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


def _loss(model: torch.nn.Module) -> torch.Tensor:
    device = next(model.parameters()).device
    return model(torch.arange(6.0, device=device).view(2, 3)).pow(2).mean()


def _weights(model: torch.nn.Module) -> list:
    return [p.detach().float().cpu().clone() for p in model.parameters()]


def _grads(optimizer) -> list:
    return [None if p.grad is None else p.grad.float().cpu().clone()
            for group in optimizer.param_groups for p in group["params"]]


def _state_devices(optimizer) -> list:
    """The device of every tensor in the optimizer's per-parameter state."""
    return sorted(str(value.device) for state in optimizer.state.values() for value in state.values()
                  if isinstance(value, torch.Tensor))


class NoSetToNone(torch.optim.SGD):
    """An optimizer whose ``zero_grad`` takes no ``set_to_none`` (older third-party optimizers)."""

    def zero_grad(self) -> None:  # noqa: D102 - the narrower signature is the point
        super().zero_grad(set_to_none=False)


class WithModes(torch.optim.SGD):
    """An optimizer with ``train``/``eval`` (as schedule-free ones have) that records the calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.modes: list[str] = []

    def train(self) -> None:
        self.modes.append("train")

    def eval(self) -> None:
        self.modes.append("eval")


class Wrapping:
    """An optimizer wrapper (as DeepSpeed's) whose inner ``optimizer`` has the modes, not itself."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.optimizer = inner
        self.param_groups = inner.param_groups
        self.state = inner.state
        self.defaults = inner.defaults

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)


@probe(AREA)
def move_to_device(api: Api) -> None:
    move = "optimizer.move_to_device"
    api.call("a tensor", move, torch.ones(2), "cpu")
    api.call("a list and a tuple", move, [torch.ones(1), (torch.zeros(1), 3)], "cpu")
    api.call("a named tuple", move, Pair(torch.ones(1), "x"), "cpu")
    api.call("an ordered dict", move, collections.OrderedDict(a=torch.ones(1), b=None), "cpu")
    api.call("a state dict", move, torch.optim.SGD(_model().parameters(), lr=0.1).state_dict(), "cpu")
    api.call("not a tensor", move, "text", "cpu")
    api.call("a set is left as it is", move, {1, 2}, "cpu")
    api.call("an unknown device", move, torch.ones(1), "nowhere")


@probe(AREA)
def patch_optimizer_step(api: Api) -> None:
    holder = SimpleNamespace(_accelerate_step_called=False)
    calls = []

    def method(*args, **kwargs):
        calls.append((args, kwargs))
        return "stepped"

    patched = api.call("patch", "optimizer.patch_optimizer_step", holder, method)
    if patched is not None:
        api.observe("the patched method", patched, 1, closure=None)
        api.record("recorded on the holder", holder._accelerate_step_called)
        api.record("the method's calls", calls)
        api.observe("a method that raises", api.get("optimizer.patch_optimizer_step")(holder, lambda: 1 / 0))
    api.call("a holder that takes no attributes", "optimizer.patch_optimizer_step", object(), method)


@probe(AREA, families=("cpu", "cuda"))
def construct(api: Api) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _loss(model).backward()
    optimizer.step()  # a momentum buffer: state to place
    cls = api.get(CLASS)
    accelerator = api.accelerator()
    wrapped = api.observe("direct", cls, optimizer)
    if wrapped is not None:
        api.observe("direct: attributes", _summary, wrapped)
    api.observe("direct, no device placement", lambda: _summary(cls(optimizer, device_placement=False)))
    api.observe("direct, a scaler", lambda: _summary(cls(optimizer, scaler=torch.amp.GradScaler("cpu"))))
    api.observe("not an optimizer", cls, "text")
    api.observe("an optimizer without state_dict, no device placement",
                lambda: _summary(cls(SimpleNamespace(step=lambda: None), device_placement=False)))
    api.observe("a scaler and an optimizer without step, no device placement",
                lambda: _summary(cls(SimpleNamespace(), device_placement=False, scaler=torch.amp.GradScaler("cpu"))))
    moved = _model().to(accelerator.device)
    prepared = api.observe("prepare", accelerator.prepare, torch.optim.SGD(moved.parameters(), lr=0.1))
    if prepared is not None:
        api.observe("prepare: attributes", _summary, prepared)
    api.observe("prepare a state on the CPU: its devices", lambda: _state_devices(accelerator.prepare(optimizer)))
    api.observe("prepare_optimizer device_placement False: its devices",
                lambda: _state_devices(accelerator.prepare_optimizer(_stepped_sgd(), device_placement=False)))


@probe(AREA)
def construct_without_an_accelerator(api: Api) -> None:
    api.observe("a wrapped optimizer", lambda: _summary(api.get(CLASS)(_stepped_sgd())))
    api.observe("no device placement", lambda: _summary(api.get(CLASS)(_stepped_sgd(), device_placement=False)))


def _stepped_sgd() -> torch.optim.Optimizer:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _loss(model).backward()
    optimizer.step()
    return optimizer


def _summary(wrapped) -> dict:
    """What a user reads of a wrapped optimizer."""
    return {
        "state devices": _state_devices(wrapped) if hasattr(wrapped.optimizer, "state") else None,
        "device_placement": wrapped.device_placement,
        "scaler": type(wrapped.scaler).__name__,
        "step_was_skipped": wrapped.step_was_skipped,
        "_is_overflow": wrapped._is_overflow,
        "is a torch optimizer": isinstance(wrapped, torch.optim.Optimizer),
        "gradient_state": type(wrapped.gradient_state).__name__,
        "accelerator_state": type(wrapped.accelerator_state).__name__,
    }


@probe(AREA)
def step(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    _loss(model).backward()
    api.observe("step", optimizer.step)
    api.record("weights after a step", _weights(model))

    def closure():
        optimizer.zero_grad()
        loss = _loss(model)
        loss.backward()
        return loss

    api.observe("step with a closure", optimizer.step, closure)
    api.record("weights after a closure step", _weights(model))
    api.observe("step with a closure by keyword", optimizer.step, closure=closure)
    api.observe("step with a closure that is not callable", optimizer.step, 3)
    api.observe("step with two arguments", optimizer.step, closure, 1)
    lbfgs_model = _model()
    lbfgs = accelerator.prepare(torch.optim.LBFGS(lbfgs_model.parameters(), lr=0.1, max_iter=2))

    def lbfgs_closure():
        lbfgs.zero_grad()
        loss = _loss(lbfgs_model)
        loss.backward()
        return loss

    api.observe("LBFGS step with a closure", lbfgs.step, lbfgs_closure)
    api.observe("LBFGS step without a closure", lbfgs.step)
    api.record("LBFGS weights", _weights(lbfgs_model))
    api.observe("step_was_skipped", lambda: optimizer.step_was_skipped)
    api.observe("accelerator.optimizer_step_was_skipped", lambda: accelerator.optimizer_step_was_skipped)


@probe(AREA, worlds=(1, 2))
def step_and_zero_grad_while_accumulating(api: Api) -> None:
    accelerator = api.accelerator(gradient_accumulation_steps=2)
    model, optimizer = accelerator.prepare(_model(), torch.optim.SGD(_model().parameters(), lr=0.1))
    seen = []
    for batch in range(4):
        with accelerator.accumulate(model):
            accelerator.backward(_loss(model) * (api.rank + 1))
            optimizer.step()
            seen.append({"sync": accelerator.sync_gradients, "weights": _weights(model)})
            optimizer.zero_grad()
            seen.append({"grads after zero_grad": _grads(optimizer)})
    api.record("micro-batches", seen)


@probe(AREA)
def zero_grad(api: Api) -> None:
    accelerator = api.accelerator()
    for label, optimizer_class in (("SGD", torch.optim.SGD), ("no set_to_none", NoSetToNone)):
        for set_to_none in (None, True, False):
            model = _model()
            optimizer = accelerator.prepare(optimizer_class(model.parameters(), lr=0.1))
            _loss(model).backward()
            arguments = {} if set_to_none is None else {"set_to_none": set_to_none}
            api.observe(f"{label}: zero_grad({arguments})", optimizer.zero_grad, **arguments)
            api.record(f"{label}: grads after zero_grad({arguments})", _grads(optimizer))
    api.observe("positional set_to_none", optimizer.zero_grad, True)
    api.observe("an unknown keyword", optimizer.zero_grad, foreach=True)


@probe(AREA)
def state_dicts(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = accelerator.prepare(torch.optim.Adam(model.parameters(), lr=0.1))
    _loss(model).backward()
    optimizer.step()
    saved = api.observe("state_dict", optimizer.state_dict)
    api.observe("state_dict is the wrapped one's", lambda: optimizer.state_dict() == optimizer.optimizer.state_dict())
    fresh_model = _model()
    fresh = accelerator.prepare(torch.optim.Adam(fresh_model.parameters(), lr=0.5))
    api.observe("load_state_dict", fresh.load_state_dict, saved)
    api.observe("loaded state", fresh.state_dict)
    api.observe("load_state_dict of another optimizer's groups", fresh.load_state_dict,
                torch.optim.Adam([torch.nn.Parameter(torch.ones(1))]).state_dict())
    api.observe("load_state_dict of a list", fresh.load_state_dict, [])
    api.observe("load_state_dict missing keys", fresh.load_state_dict, {"state": {}})


@probe(AREA)
def wrapped_attributes(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    api.observe("defaults", lambda: optimizer.defaults)
    api.observe("param_groups", lambda: [{k: v for k, v in group.items() if k != "params"}
                                         for group in optimizer.param_groups])
    api.observe("param_groups are the wrapped ones", lambda: optimizer.param_groups is optimizer.optimizer.param_groups)
    _loss(model).backward()
    optimizer.step()
    api.observe("state", lambda: {str(i): s for i, s in enumerate(optimizer.state.values())})
    api.observe("state is the wrapped one's", lambda: optimizer.state is optimizer.optimizer.state)

    def set_attributes():
        optimizer.defaults = {"lr": 1.0}
        optimizer.param_groups = optimizer.param_groups[:1]
        optimizer.state = collections.defaultdict(dict)
        return [optimizer.optimizer.defaults, len(optimizer.optimizer.param_groups), dict(optimizer.optimizer.state)]

    api.observe("setting defaults, param_groups and state", set_attributes)
    extra = torch.nn.Parameter(torch.ones(2))
    api.observe("add_param_group", optimizer.add_param_group, {"params": [extra], "lr": 0.01})
    api.observe("after add_param_group", lambda: [len(g["params"]) for g in optimizer.optimizer.param_groups])
    api.observe("add_param_group of a parameter already in a group", optimizer.add_param_group, {"params": [extra]})
    api.observe("add_param_group of a list", optimizer.add_param_group, [extra])
    api.observe("add_param_group of a non-leaf tensor", optimizer.add_param_group, {"params": [extra * 2]})
    api.observe("an attribute the wrapper lacks", lambda: optimizer.no_such_attribute)
    api.observe("is a torch optimizer", isinstance, optimizer, torch.optim.Optimizer)
    api.observe("repr", lambda: repr(optimizer).splitlines()[0])


@probe(AREA)
def train_and_eval(api: Api) -> None:
    accelerator = api.accelerator()
    plain = accelerator.prepare(torch.optim.SGD(_model().parameters(), lr=0.1))
    api.observe("plain: train", plain.train)
    api.observe("plain: eval", plain.eval)
    with_modes = accelerator.prepare(WithModes(_model().parameters(), lr=0.1))
    api.observe("with modes: train", with_modes.train)
    api.observe("with modes: eval", with_modes.eval)
    api.record("with modes: calls", with_modes.optimizer.modes)
    inner = WithModes(_model().parameters(), lr=0.1)
    wrapping = api.get(CLASS)(Wrapping(inner))
    api.observe("wrapping: train", wrapping.train)
    api.observe("wrapping: eval", wrapping.eval)
    api.record("wrapping: inner calls", inner.modes)
    not_callable = accelerator.prepare(torch.optim.SGD(_model().parameters(), lr=0.1))
    not_callable.optimizer.train = "not callable"
    api.observe("a train attribute that is not callable", not_callable.train)


@probe(AREA)
def skipped_step_flags(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    api.observe("step_was_skipped", lambda: optimizer.step_was_skipped)
    api.observe("_is_overflow", lambda: optimizer._is_overflow)
    optimizer._is_overflow = True
    api.observe("step_was_skipped after setting _is_overflow", lambda: optimizer.step_was_skipped)
    api.observe("accelerator.optimizer_step_was_skipped", lambda: accelerator.optimizer_step_was_skipped)
    _loss(model).backward()
    optimizer.step()
    api.observe("after a step without a scaler", lambda: optimizer.step_was_skipped)

    def assign():
        optimizer.step_was_skipped = False

    api.observe("assigning step_was_skipped", assign)


@probe(AREA, families=("cpu", "cuda"))
def pickling(api: Api) -> None:
    precision = "fp16" if api.family == "cuda" else "no"
    accelerator = api.accelerator(mixed_precision=precision)
    model = _model().to(accelerator.device)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    api.observe("__getstate__ keys", lambda: sorted(optimizer.__getstate__()))
    accelerator.backward(_loss(model))
    optimizer.step()
    api.observe("__getstate__ keys after a step", lambda: sorted(optimizer.__getstate__()))
    copy = api.observe("pickle round trip", lambda: pickle.loads(pickle.dumps(optimizer)))
    if copy is not None:
        api.observe("the copy", lambda: {"attributes": _public(vars(copy)), "lr": copy.param_groups[0]["lr"],
                                         "skipped": copy.step_was_skipped, "scaler": type(copy.scaler).__name__})
    blank = api.get(CLASS).__new__(api.get(CLASS))
    api.observe("__setstate__ of a state", blank.__setstate__, optimizer.__getstate__())
    api.observe("after __setstate__", lambda: _public(vars(blank)))
    api.observe("__setstate__ of a state without a scaler", api.get(CLASS).__new__(api.get(CLASS)).__setstate__,
                {"optimizer": optimizer.optimizer})
    api.observe("__setstate__ of a list", blank.__setstate__, [])


def _public(attributes: dict) -> list[str]:
    """The attribute names a user reads (each implementation keeps its own private step bookkeeping)."""
    return sorted(name for name in attributes if not name.startswith("_"))


@probe(AREA, families=("cuda",))
def fp16_skipped_step(api: Api) -> None:
    """HF's GPU path: the gradient scaler skips a step whose gradients overflowed, and says so."""
    accelerator = api.accelerator(mixed_precision="fp16")
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer.optimizer, step_size=1, gamma=0.5))
    api.observe("a scaler", lambda: type(optimizer.scaler).__name__)
    accelerator.backward(_loss(model))
    api.observe("step", optimizer.step)
    scheduler.step()
    api.record("after a step", {"skipped": optimizer.step_was_skipped, "weights": _weights(model),
                                "lr": scheduler.get_last_lr(), "scale": optimizer.scaler.get_scale()})
    optimizer.zero_grad()
    accelerator.backward(_loss(model) * float("inf"))
    api.observe("step of overflowing gradients", optimizer.step)
    scheduler.step()
    api.record("after an overflow", {"skipped": optimizer.step_was_skipped, "weights": _weights(model),
                                     "accelerator says": accelerator.optimizer_step_was_skipped,
                                     "lr": scheduler.get_last_lr(), "scale": optimizer.scaler.get_scale()})
    optimizer.zero_grad()
    accelerator.backward(_loss(model))

    def closure():
        return torch.tensor(1.5)

    api.observe("step with a closure", optimizer.step, closure)
    api.record("after a closure step", {"skipped": optimizer.step_was_skipped, "weights": _weights(model)})
    api.observe("__getstate__ keys", lambda: sorted(optimizer.__getstate__()))
    calls = []
    original = optimizer.optimizer.step

    def assigned_step(*args, **kwargs):
        calls.append("assigned")
        return original(*args, **kwargs)

    optimizer.optimizer.step = assigned_step
    optimizer.zero_grad()
    accelerator.backward(_loss(model))
    api.observe("step after assigning the wrapped optimizer's step", optimizer.step)
    api.record("the assigned step's calls, and whether it is kept", [calls, optimizer.optimizer.step is assigned_step])
