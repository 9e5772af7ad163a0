"""Probes of ``accelerate.accelerator``'s training path: ``prepare`` and the ``prepare_*`` methods with their
refusals, ``backward``, ``accumulate``/``no_sync``/``trigger_sync_in_backward``, ``join_uneven_inputs``,
clipping and unscaling, ``autocast``, ``unwrap_model``, ``free_memory``/``clear``, ``skip_first_batches``,
``verify_device_map``, ``profile`` and LOMO's backward.

The model is a seeded ``Linear(3, 2)``; values of weights and gradients are compared exactly.
"""

from __future__ import annotations

import os
import shutil

import torch

from ..probe import Api, probe

AREA = "accelerator"


def _model() -> torch.nn.Module:
    return torch.nn.Linear(3, 2)


def _loss(model: torch.nn.Module, rank: int = 0) -> torch.Tensor:
    inputs = torch.arange(6.0).view(2, 3) + rank
    return model(inputs).pow(2).mean()


def _grads(model: torch.nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _kind(obj) -> str:
    return type(obj).__name__


@probe(AREA, worlds=(1, 2))
def prepare_returns(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    prepared = accelerator.prepare(model, optimizer, loader, scheduler)
    api.observe("model, optimizer, loader, scheduler", lambda: [_kind(obj) for obj in prepared])
    api.observe("nothing", accelerator.prepare)
    api.observe("one object", accelerator.prepare, "a string")
    api.observe("other objects", accelerator.prepare, 1, None, "x")
    if prepared:
        p_model, p_optimizer, p_loader, p_scheduler = prepared
        api.observe("prepared again", lambda: [a is b for a, b in zip(
            accelerator.prepare(p_model, p_optimizer, p_loader, p_scheduler), prepared)])
        api.observe("the scheduler's optimizer", lambda: p_scheduler.optimizer is p_optimizer)
        api.observe("_is_accelerate_prepared", lambda: [getattr(o, "_is_accelerate_prepared", None) for o in prepared])
    api.observe("counts", lambda: [len(accelerator._models), len(accelerator._optimizers),
                                   len(accelerator._dataloaders), len(accelerator._schedulers)])


@probe(AREA)
def prepare_device_placement(api: Api) -> None:
    accelerator = api.accelerator()
    model, loader = _model(), torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    api.observe("one flag per object", lambda: [_kind(o) for o in accelerator.prepare(
        model, loader, device_placement=[False, True])])
    api.observe("too few flags", accelerator.prepare, _model(), loader, device_placement=[True])
    api.observe("too many flags", accelerator.prepare, _model(), device_placement=[True, False])
    api.observe("flags as a tuple", lambda: _kind(accelerator.prepare(_model(), device_placement=(False,))))
    api.observe("a flag that is not a list", accelerator.prepare, _model(), device_placement=True)


@probe(AREA, worlds=(1, 2))
def prepare_single_methods(api: Api) -> None:
    accelerator = api.accelerator()
    model = accelerator.prepare_model(_model())
    api.observe("prepare_model", _kind, model)
    api.observe("prepare_model evaluation_mode", lambda: _kind(accelerator.prepare_model(_model(),
                                                                                         evaluation_mode=True)))
    api.observe("prepare_model device_placement False", lambda: _kind(accelerator.prepare_model(
        _model(), device_placement=False)))
    bare = _model()
    optimizer = torch.optim.SGD(bare.parameters(), lr=0.1)
    prepared_optimizer = api.observe("prepare_optimizer", accelerator.prepare_optimizer, optimizer)
    api.observe("prepare_optimizer: its device_placement", lambda: prepared_optimizer.device_placement)
    api.observe("prepare_optimizer device_placement", lambda: _kind(accelerator.prepare_optimizer(
        torch.optim.SGD(_model().parameters(), lr=0.1), device_placement=False)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    prepared_scheduler = api.observe("prepare_scheduler", accelerator.prepare_scheduler, scheduler)
    if prepared_scheduler is not None:
        api.observe("the scheduler's optimizer is the prepared one",
                    lambda: prepared_scheduler.optimizer is prepared_optimizer)
    orphan = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(_model().parameters(), lr=0.1), lambda step: 1.0)
    api.observe("a scheduler whose optimizer is not prepared", lambda: _kind(accelerator.prepare_scheduler(orphan)))
    loader = accelerator.prepare_data_loader(torch.utils.data.DataLoader(list(range(6)), batch_size=2))
    api.observe("prepare_data_loader", lambda: (_kind(loader), [b for b in loader]))
    api.observe("prepare_data_loader device_placement False", lambda: _kind(accelerator.prepare_data_loader(
        torch.utils.data.DataLoader(list(range(6)), batch_size=2), device_placement=False)))


@probe(AREA, worlds=(1, 2))
def prepare_refuses_a_dispatched_model(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    model.hf_device_map = {"weight": "cpu", "bias": "disk"}
    api.observe("verify_device_map", accelerator.verify_device_map, model)
    api.observe("verify_device_map of one device", accelerator.verify_device_map, _with_map({"": "cpu"}))
    api.observe("verify_device_map of a plain model", accelerator.verify_device_map, _model())
    api.observe("verify_device_map of a child's map", accelerator.verify_device_map,
                torch.nn.Sequential(model))
    api.observe("prepare", lambda: _kind(accelerator.prepare(model)))
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    api.observe("prepare a loader, then the model", accelerator.prepare, loader, model)
    api.observe("what that prepare left prepared", lambda: len(accelerator._dataloaders))
    api.observe("prepare_model", lambda: _kind(accelerator.prepare_model(_with_map({"a": "cpu", "b": "cpu"}))))


def _with_map(device_map: dict) -> torch.nn.Module:
    model = _model()
    model.hf_device_map = device_map
    return model


@probe(AREA, env={"ACCELERATE_BYPASS_DEVICE_MAP": "true"}, worlds=(2,))
def prepare_a_dispatched_model_bypassing_the_check(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("prepare_model", lambda: _kind(accelerator.prepare_model(_with_map({"a": "cpu", "b": "cpu"}))))


@probe(AREA, worlds=(1, 2))
def backward_and_accumulate(api: Api) -> None:
    accelerator = api.accelerator(gradient_accumulation_steps=2)
    model, optimizer = accelerator.prepare(_model(), torch.optim.SGD(_model().parameters(), lr=0.1))
    steps = []
    for step in range(3):
        with accelerator.accumulate(model):
            accelerator.backward(_loss(model, api.rank))
            steps.append({"sync": accelerator.sync_gradients, "step": accelerator.step, "grads": _grads(model)})
    api.record("steps", steps)
    api.observe("backward with retain_graph", lambda: accelerator.backward(_loss(model), retain_graph=True))
    api.observe("backward of a tensor without grad", accelerator.backward, torch.tensor(1.0))
    api.observe("backward with an unknown keyword", accelerator.backward, _loss(model), no_such=1)
    api.observe("backward with a learning rate and no LOMO", accelerator.backward, _loss(model),
                learning_rate=0.1)


@probe(AREA, worlds=(1, 2))
def no_sync_and_trigger_sync(api: Api) -> None:
    accelerator = api.accelerator()
    model = accelerator.prepare(_model())
    with accelerator.no_sync(model):
        accelerator.backward(_loss(model, api.rank))
    api.record("grads after no_sync", _grads(model))
    model.zero_grad()
    with accelerator.no_sync(model):
        loss = _loss(model, api.rank)
        with accelerator.trigger_sync_in_backward(model):
            accelerator.backward(loss)
    api.record("grads after trigger_sync_in_backward", _grads(model))
    api.observe("no_sync of a plain module", lambda: accelerator.no_sync(torch.nn.Linear(1, 1)).__enter__())
    api.observe("trigger_sync_in_backward of a plain module",
                lambda: accelerator.trigger_sync_in_backward(torch.nn.Linear(1, 1)).__enter__())


@probe(AREA)
def accumulate_with_a_plugin(api: Api) -> None:
    plugin = api.get("utils.GradientAccumulationPlugin")(num_steps=2, sync_with_dataloader=False,
                                                        sync_each_batch=True)
    accelerator = api.accelerator(gradient_accumulation_plugin=plugin)
    model = accelerator.prepare(_model())
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(3)), batch_size=1))
    seen = []
    for _ in loader:
        with accelerator.accumulate(model):
            seen.append(accelerator.sync_gradients)
    api.record("sync per batch", seen)
    api.observe("gradient_state", lambda: accelerator.gradient_state.plugin_kwargs)


@probe(AREA, worlds=(1, 2))
def join_uneven_inputs(api: Api) -> None:
    accelerator = api.accelerator()
    model = accelerator.prepare(_model())
    api.observe("join", lambda: _enter(accelerator.join_uneven_inputs([model])))
    api.observe("join with even_batches", lambda: _enter(accelerator.join_uneven_inputs([model], even_batches=False)))


def _enter(context) -> object:
    with context as value:
        return value


def _precisions(api: Api, *precisions: str) -> tuple[str, ...]:
    """The precisions to run on this family: HF 1.15 ignores fp16 on the CPU (catalog autocast.fp16_scaler, a
    deviation the constructor probe records), so fp16 runs on the mock GPU only."""
    return precisions if api.family == "cuda" else tuple(p for p in precisions if p != "fp16")


@probe(AREA, families=("cpu", "cuda"))
def clip_and_unscale(api: Api) -> None:
    for precision in _precisions(api, "no", "fp16"):
        api.get("state.AcceleratorState")._reset_state(True)
        accelerator = api.accelerator(mixed_precision=precision)
        model = _model()
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        accelerator.backward(_loss(model))
        api.record(f"{precision}: grads after backward", [g.float().cpu() for g in _grads(model)])
        api.observe(f"{precision}: unscale_gradients", accelerator.unscale_gradients)
        api.observe(f"{precision}: unscale_gradients of one optimizer", accelerator.unscale_gradients, optimizer)
        api.observe(f"{precision}: clip_grad_norm_", lambda: accelerator.clip_grad_norm_(model.parameters(), 0.5).cpu())
        api.observe(f"{precision}: clip_grad_norm_ inf norm",
                    lambda: accelerator.clip_grad_norm_(model.parameters(), 0.5, norm_type=float("inf")).cpu())
        api.observe(f"{precision}: clip_grad_value_", accelerator.clip_grad_value_, model.parameters(), 0.01)
        api.record(f"{precision}: grads after clipping", [g.float().cpu() for g in _grads(model)])
        api.observe(f"{precision}: optimizer step", optimizer.step)
        api.observe(f"{precision}: optimizer_step_was_skipped", getattr, accelerator, "optimizer_step_was_skipped")
    api.observe("clip_grad_norm_ of a parameter list", lambda: accelerator.clip_grad_norm_(
        list(model.parameters()), 1.0, norm_type=1).cpu())
    api.observe("clip_grad_norm_ without gradients", lambda: accelerator.clip_grad_norm_(
        _model().parameters(), 1.0).cpu())


@probe(AREA, families=("cpu", "cuda"))
def autocast(api: Api) -> None:
    handler_class = api.get("utils.AutocastKwargs")
    for precision in _precisions(api, "no", "bf16", "fp16"):
        api.get("state.AcceleratorState")._reset_state(True)
        accelerator = api.accelerator(mixed_precision=precision)
        device = accelerator.device
        a = torch.ones(2, 2, device=device)

        def product(context):
            with context:
                return (a @ a).dtype

        api.observe(f"{precision}: autocast()", product, accelerator.autocast())
        api.observe(f"{precision}: autocast(enabled=False)", product,
                    accelerator.autocast(autocast_handler=handler_class(enabled=False)))
        api.observe(f"{precision}: autocast positional handler", product, accelerator.autocast(handler_class()))
        model = accelerator.prepare(_model())
        api.observe(f"{precision}: prepared forward dtype", lambda: model(torch.ones(1, 3, device=device)).dtype)
        api.observe(f"{precision}: _original_forward kept", lambda: hasattr(model, "_original_forward"))
        unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
        api.observe(f"{precision}: forward after unwrap without the wrapper",
                    lambda: unwrapped(torch.ones(1, 3, device=device)).dtype)
    api.observe("autocast(cache_enabled=True)", lambda: product(accelerator.autocast(cache_enabled=True)))
    api.observe("autocast(cache_enabled) positionally", lambda: product(accelerator.autocast(True)))


@probe(AREA, worlds=(1, 2))
def unwrap_model(api: Api) -> None:
    accelerator = api.accelerator()
    model = accelerator.prepare(_model())
    api.observe("unwrap", lambda: _kind(accelerator.unwrap_model(model)))
    api.observe("unwrap keep_fp32_wrapper False", lambda: _kind(accelerator.unwrap_model(model,
                                                                                          keep_fp32_wrapper=False)))
    api.observe("unwrap a bare model", lambda: _kind(accelerator.unwrap_model(_model())))
    api.observe("unwrap a non-module", accelerator.unwrap_model, "text")


@probe(AREA)
def free_memory_and_clear(api: Api) -> None:
    accelerator = api.accelerator(gradient_accumulation_steps=2)
    model = _model()
    prepared = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with accelerator.accumulate(prepared[0]):
        pass
    api.observe("step before", getattr, accelerator, "step")
    api.observe("free_memory", accelerator.free_memory, *prepared)
    api.observe("after free_memory", lambda: [accelerator.step, len(accelerator._models),
                                              len(accelerator._optimizers)])
    api.observe("free_memory of nothing", accelerator.free_memory)
    api.observe("clear", accelerator.clear, 1, "x")
    api.observe("deepspeed_engine_wrapped", getattr, accelerator, "deepspeed_engine_wrapped")


@probe(AREA, worlds=(1, 2))
def skip_first_batches(api: Api) -> None:
    accelerator = api.accelerator()
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(10)), batch_size=2))
    api.observe("skip 2", lambda: [b for b in accelerator.skip_first_batches(loader, num_batches=2)])
    api.observe("skip 0", lambda: [b for b in accelerator.skip_first_batches(loader)])
    api.observe("skip more than there are", lambda: [b for b in accelerator.skip_first_batches(loader, 50)])
    plain = torch.utils.data.DataLoader(list(range(6)), batch_size=2)
    api.observe("skip on a loader that is not prepared",
                lambda: (_kind(accelerator.skip_first_batches(plain, 1)),
                         [b for b in accelerator.skip_first_batches(plain, 1)]))


@probe(AREA)
def profile(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("profile yields", lambda: _kind(_enter(accelerator.profile())))
    handler = api.get("utils.ProfileKwargs")(output_trace_dir="traces", activities=["cpu"])
    api.observe("profile to a trace dir", lambda: _kind(_enter(accelerator.profile(handler))))
    api.observe("trace files", lambda: sorted(os.listdir("traces")))
    shutil.rmtree("traces")  # a trace's ids and times differ from run to run


@probe(AREA)
def lomo_backward(api: Api) -> None:
    accelerator = api.accelerator()
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    api.observe("without a learning rate", accelerator.lomo_backward, _loss(model), None)
    api.observe("without a LOMO optimizer", accelerator.lomo_backward, _loss(model), 0.1)
    from lomo_optim import Lomo

    lomo_model = _model()
    lomo_model, lomo = accelerator.prepare(lomo_model, Lomo(lomo_model, lr=0.1))
    api.observe("with a LOMO optimizer", accelerator.lomo_backward, _loss(lomo_model), 0.1)
    api.record("weights after", [p.detach().clone() for p in lomo_model.parameters()])
    api.observe("backward with a learning rate", accelerator.backward, _loss(lomo_model), learning_rate=0.1)
    api.record("weights after backward", [p.detach().clone() for p in lomo_model.parameters()])
