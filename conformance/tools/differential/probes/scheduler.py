"""Probes of ``accelerate.scheduler``: ``AcceleratedScheduler`` built directly and through ``prepare``, its
``step`` under ``split_batches`` and ``step_scheduler_with_optimizer`` at 1 and 2 processes, with gradient
accumulation, after a skipped optimizer step and past OneCycleLR's total, and its pass-throughs
(``get_last_lr``, ``get_lr``, ``state_dict``/``load_state_dict``, ``print_lr``).

The GPU path (a step the fp16 scaler skipped) is in the ``optimizer`` probes' ``fp16_skipped_step``.
"""

from __future__ import annotations

import torch

from ..probe import Api, probe

AREA = "scheduler"
CLASS = "scheduler.AcceleratedScheduler"


def _model() -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


def _loss(model: torch.nn.Module) -> torch.Tensor:
    return model(torch.arange(6.0).view(2, 3)).pow(2).mean()


def _linear_decay(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - 0.1 * step)


def _fresh_accelerator(api: Api, **kwargs):
    api.get("state.AcceleratorState")._reset_state(True)
    return api.accelerator(**kwargs)


def _train(accelerator, model, optimizer, scheduler, updates: int) -> list:
    """``updates`` training steps (backward, step, scheduler step, zero_grad); the learning rates after each."""
    seen = []
    for _ in range(updates):
        with accelerator.accumulate(model):
            accelerator.backward(_loss(model))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        seen.append([round(lr, 6) for lr in scheduler.get_last_lr()] + [scheduler.scheduler._step_count])
    return seen


@probe(AREA, worlds=(1, 2))
def step_with_split_batches_and_optimizer(api: Api) -> None:
    config = api.get("utils.DataLoaderConfiguration")
    for split_batches in (False, True):
        for with_optimizer in (True, False):
            label = f"split_batches={split_batches} step_with_optimizer={with_optimizer}"
            accelerator = _fresh_accelerator(api, dataloader_config=config(split_batches=split_batches),
                                             step_scheduler_with_optimizer=with_optimizer)
            model = _model()
            optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
            model, optimizer, scheduler = accelerator.prepare(model, optimizer, _linear_decay(optimizer))
            api.record(f"{label}: attributes", {"split_batches": scheduler.split_batches,
                                                "step_with_optimizer": scheduler.step_with_optimizer})
            api.observe(f"{label}: learning rates", _train, accelerator, model, optimizer, scheduler, 3)


@probe(AREA, worlds=(1, 2))
def step_past_one_cycle_total(api: Api) -> None:
    config = api.get("utils.DataLoaderConfiguration")
    for split_batches in (False, True):
        accelerator = _fresh_accelerator(api, dataloader_config=config(split_batches=split_batches))
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1.0, total_steps=3)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, one_cycle)
        api.observe(f"split_batches={split_batches}: five updates", _train, accelerator, model, optimizer,
                    scheduler, 5)


@probe(AREA, worlds=(1, 2))
def step_while_accumulating(api: Api) -> None:
    plugin = api.get("utils.GradientAccumulationPlugin")
    for label, kwargs in (("gradient_accumulation_steps=2", {"gradient_accumulation_steps": 2}),
                          ("adjust_scheduler=False", {"gradient_accumulation_plugin": plugin(
                              num_steps=2, adjust_scheduler=False)}),
                          ("adjust_scheduler=True", {"gradient_accumulation_plugin": plugin(
                              num_steps=2, adjust_scheduler=True)})):
        accelerator = _fresh_accelerator(api, **kwargs)
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, _linear_decay(optimizer))
        api.observe(f"{label}: adjust_scheduler", lambda: accelerator.gradient_state.adjust_scheduler)
        api.observe(f"{label}: four micro-batches", _train, accelerator, model, optimizer, scheduler, 4)


@probe(AREA, worlds=(1, 2))
def step_after_a_skipped_optimizer_step(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, _linear_decay(optimizer))
    optimizer._is_overflow = True
    api.observe("a skipped step", scheduler.step)
    api.record("after a skipped step", [scheduler.get_last_lr(), scheduler.scheduler._step_count])
    optimizer._is_overflow = False
    api.observe("a real step", scheduler.step)
    api.record("after a real step", [scheduler.get_last_lr(), scheduler.scheduler._step_count])
    orphan_optimizer = torch.optim.SGD(_model().parameters(), lr=1.0)
    orphan = accelerator.prepare_scheduler(_linear_decay(orphan_optimizer))
    api.observe("an orphan follows every prepared optimizer", lambda: [o is optimizer for o in orphan.optimizers])
    later = accelerator.prepare_optimizer(torch.optim.SGD(_model().parameters(), lr=1.0))
    later._is_overflow = True
    api.observe("an orphan after a later optimizer skipped", orphan.step)
    api.record("the orphan's count", orphan.scheduler._step_count)


@probe(AREA)
def construct(api: Api) -> None:
    accelerator = api.accelerator()
    cls = api.get(CLASS)
    optimizer = accelerator.prepare(torch.optim.SGD(_model().parameters(), lr=1.0))
    for label, optimizers in (("one optimizer", optimizer), ("a list", [optimizer]), ("a tuple", (optimizer,))):
        built = api.observe(label, cls, _linear_decay(optimizer.optimizer), optimizers)
        if built is not None:
            api.observe(f"{label}: attributes", lambda: {
                "optimizers": type(built.optimizers).__name__, "same list": built.optimizers is optimizers,
                "split_batches": built.split_batches, "step_with_optimizer": built.step_with_optimizer,
                "gradient_state": type(built.gradient_state).__name__})
    bare = torch.optim.SGD(_model().parameters(), lr=1.0)
    unprepared = cls(_linear_decay(bare), bare)
    api.observe("an unprepared optimizer: step", unprepared.step)
    detached = cls(_linear_decay(bare), bare, step_with_optimizer=False)
    api.observe("step_with_optimizer=False: step", detached.step)
    api.observe("step_with_optimizer=False: step with an epoch", detached.step, 5)
    api.record("step_with_optimizer=False: lr", detached.get_last_lr())
    split = cls(_linear_decay(optimizer.optimizer), optimizer, split_batches=True)
    api.observe("split_batches=True: step", split.step)
    api.observe("split_batches=True: step with an unknown keyword", split.step, no_such=1)
    api.observe("no optimizers: step", cls(_linear_decay(bare), []).step)
    api.observe("not a scheduler: step", cls("text", optimizer).step)
    api.observe("isinstance of LRScheduler", isinstance, split, torch.optim.lr_scheduler.LRScheduler)
    api.observe("an attribute the wrapper lacks", lambda: split.last_epoch)


@probe(AREA)
def construct_without_an_accelerator(api: Api) -> None:
    bare = torch.optim.SGD(_model().parameters(), lr=1.0)
    api.call("a scheduler", CLASS, _linear_decay(bare), bare, step_with_optimizer=False)
    api.observe("step_with_optimizer=False: step", lambda: api.get(CLASS)(_linear_decay(bare), bare,
                                                                           step_with_optimizer=False).step())


@probe(AREA)
def pass_throughs(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, _linear_decay(optimizer))
    _train(accelerator, model, optimizer, scheduler, 2)
    api.observe("get_last_lr", scheduler.get_last_lr)
    api.observe("get_lr", scheduler.get_lr)
    saved = api.observe("state_dict", scheduler.state_dict)
    fresh_optimizer = torch.optim.SGD(_model().parameters(), lr=1.0)
    fresh = accelerator.prepare(_linear_decay(fresh_optimizer))
    api.observe("load_state_dict", fresh.load_state_dict, saved)
    api.observe("after load_state_dict", lambda: [fresh.get_last_lr(), fresh.state_dict()])
    api.observe("load_state_dict without lr_lambdas", fresh.load_state_dict, {"last_epoch": 1})
    api.observe("load_state_dict of a list", fresh.load_state_dict, [])
    api.observe("print_lr", scheduler.print_lr, True, 0, 0.5)
    api.observe("print_lr with an epoch", scheduler.print_lr, True, 0, 0.5, 3)
    api.observe("print_lr not verbose", scheduler.print_lr, False, 0, 0.5)
    api.observe("print_lr without arguments", scheduler.print_lr)
    step_lr = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer.optimizer, step_size=1, gamma=0.5))
    api.observe("StepLR get_lr", step_lr.get_lr)
    api.observe("get_last_lr of a scheduler without one",
                lambda: api.get(CLASS)(_NoLastLr(), optimizer).get_last_lr())


class _NoLastLr:
    """A scheduler-like object without ``get_last_lr`` (some third-party schedulers)."""

    def step(self) -> None:
        pass
