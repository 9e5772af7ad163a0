"""Catalog section "Training": `prepare` (order, device placement, single methods, unwrapping, device maps, evaluation)."""

from __future__ import annotations

from typing import Any

import torch

from ..support.checks import expect_equal, expect_raises, expect_true

from ..support.training import (
    BATCH,
    FEATURES,
    MyModel,
    autocast_dtype,
    case,
    movable_loader,
    record_output_dtypes,
    sample_loss,
    tiny_linear,
    training_objects,
    weights_of,
)


@case("prepare.order")
def prepare_order(impl, world):
    """``prepare(model, optimizer, data_loader, scheduler)`` returns them in the same order, prepared.

    Any order works (a scheduler before its optimizer included); an object
    prepare does not know comes back unchanged; one object comes back alone.
    """
    acc = impl.Accelerator()
    model, optimizer, loader, scheduler = training_objects()
    got = acc.prepare(model, optimizer, loader, scheduler)
    expect_equal(len(got), 4, "number of objects prepare returns")
    p_model, p_optimizer, p_loader, p_scheduler = got
    expect_true(acc.unwrap_model(p_model) is model, "1st: unwrap_model(prepared model) should be the model passed")
    expect_true(isinstance(p_optimizer, torch.optim.Optimizer), f"2nd: expected an optimizer, got {type(p_optimizer).__name__}")
    driven = [p for group in p_optimizer.param_groups for p in group["params"]]
    expect_true(len(driven) == 2 and all(a is b for a, b in zip(driven, model.parameters())),
                "2nd: the prepared optimizer should drive the model's parameters")
    expect_equal(len(next(iter(p_loader))), BATCH, "3rd: length of the prepared loader's first batch")
    expect_equal(p_scheduler.get_last_lr(), scheduler.get_last_lr(), "4th: the prepared scheduler's get_last_lr()")

    model2, optimizer2, loader2, scheduler2 = training_objects()
    marker, number = object(), 42
    got = acc.prepare(loader2, scheduler2, marker, model2, number, optimizer2)
    kinds = [type(x).__name__ for x in got]
    expect_true(got[2] is marker and got[4] is number, f"unknown objects should come back unchanged in place, got {kinds}")
    expect_true(acc.unwrap_model(got[3]) is model2, f"model in 4th position, got {kinds}")
    expect_equal(got[1].get_last_lr(), scheduler2.get_last_lr(), "scheduler passed before its optimizer")
    expect_true(isinstance(got[5], torch.optim.Optimizer), f"optimizer in 6th position, got {kinds}")
    single = acc.prepare(tiny_linear())
    expect_true(isinstance(single, torch.nn.Module), f"prepare(one model) should return the model alone, got {type(single).__name__}")


@case("prepare.device_placement_list")
def prepare_device_placement_list(impl, world):
    """``device_placement=[True, True, False, False]`` places only the first two objects.

    Placement is observed without needing a second device: the model counts
    its moves (``Module._apply``, which ``.to(device)`` goes through) and
    the loader's batches record being sent to a device. The reverse list
    places only the last two; a list of the wrong length is refused.
    """
    acc = impl.Accelerator()
    model, optimizer, _, scheduler = training_objects(recorder=True)
    loader = movable_loader(8)
    p_model, _, p_loader, _ = acc.prepare(model, optimizer, loader, scheduler, device_placement=[True, True, False, False])
    expect_true(model.moves >= 1, "device_placement=[True, ...]: the model should have been moved to the device")
    on_device = torch.empty(0, device=acc.device).device  # how a tensor there reports it ("cpu", not "cpu:0")
    expect_true(all(p.device == on_device for p in model.parameters()), "placed model's parameters on accelerator.device")
    expect_equal(next(iter(p_loader)).sent_to, [], "device_placement=[..., False, False]: batches sent to a device")

    model2, optimizer2, _, scheduler2 = training_objects(recorder=True)
    p_model2, _, p_loader2, _ = acc.prepare(
        model2, optimizer2, movable_loader(8), scheduler2, device_placement=[False, False, True, True]
    )
    expect_equal(model2.moves, 0, "device_placement=[False, ...]: times the model was moved or converted")
    expect_equal(next(iter(p_loader2)).sent_to, [str(acc.device)], "device_placement=[..., True, True]: batches sent to")
    expect_raises(
        lambda: acc.prepare(tiny_linear(), tiny_linear(), device_placement=[True]), (ValueError, TypeError),
        "device_placement with 1 flag for 2 objects",
    )


def _twin_step(acc: Any, model: Any, optimizer: Any, indices: Any) -> list[float]:
    acc.backward(sample_loss(model, indices, acc.device))
    optimizer.step()
    optimizer.zero_grad()
    return weights_of(acc.unwrap_model(model))


@case("prepare.single_methods")
def prepare_single_methods(impl, world):
    """``prepare_model``, ``prepare_optimizer``, ``prepare_scheduler``, ``prepare_data_loader`` work alone.

    Each gives what ``prepare`` gives for a twin object: the same type, the
    same batches, and one training step with the same result.
    """
    acc = impl.Accelerator()
    model, optimizer, loader, scheduler = training_objects()
    twin = acc.prepare(*training_objects())
    alone = (
        acc.prepare_model(model),
        acc.prepare_optimizer(optimizer),
        acc.prepare_data_loader(loader),
        acc.prepare_scheduler(scheduler),
    )
    names = ["prepare_model", "prepare_optimizer", "prepare_data_loader", "prepare_scheduler"]
    for name, single, pair in zip(names, alone, twin):
        expect_equal(type(single).__name__, type(pair).__name__, f"{name}(x) type vs prepare(x)")
    expect_equal([b.tolist() for b in alone[2]], [b.tolist() for b in twin[2]], "prepare_data_loader batches vs prepare")
    indices = next(iter(alone[2]))
    expect_equal(_twin_step(acc, alone[0], alone[1], indices), _twin_step(acc, twin[0], twin[1], indices),
                 "weights after one step with the singly prepared objects vs prepare()")
    alone[3].step()
    twin[3].step()
    expect_equal(alone[3].get_last_lr(), twin[3].get_last_lr(), "learning rate after one scheduler step")


@case("prepare.unwrap")
def prepare_unwrap(impl, world):
    """A prepared model is a ``DistributedDataParallel`` on several processes; ``unwrap_model`` gives back ``MyModel``.

    On one process the documents do not say whether a model is wrapped; only unwrapping is checked.
    """
    acc = impl.Accelerator()
    model = MyModel()
    prepared = acc.prepare(model)
    if world.size > 1:
        expect_equal(prepared.__class__.__name__, "DistributedDataParallel", "prepared model's class at several processes")
        expect_true(isinstance(prepared, torch.nn.parallel.DistributedDataParallel), "the prepared model should be torch's DDP")
    unwrapped = acc.unwrap_model(prepared)
    expect_equal(unwrapped.__class__.__name__, "MyModel", "unwrap_model(model).__class__.__name__")
    expect_true(unwrapped is model, "unwrap_model should return the very model that was prepared")


@case("prepare.verify_device_map", worlds=["1", "2"])
def prepare_verify_device_map(impl, world):
    """``verify_device_map`` is true for a model dispatched over several devices; several processes refuse to train it.

    The model carries the ``hf_device_map`` that big-model loading
    (``device_map="auto"``) sets, with two devices. At one process only the
    check is asserted (the documents do not say prepare refuses there).
    """
    acc = impl.Accelerator()
    plain = MyModel()
    expect_true(acc.verify_device_map(plain) is False, "verify_device_map(model without a device map)")
    one_device = MyModel()
    one_device.hf_device_map = {"": "cpu"}
    expect_true(acc.verify_device_map(one_device) is False, "verify_device_map(model mapped onto one device)")
    dispatched = MyModel()
    dispatched.hf_device_map = {"linear.weight": "cpu", "linear.bias": "disk"}
    expect_true(acc.verify_device_map(dispatched) is True, "verify_device_map(model mapped over cpu and disk)")
    outer = torch.nn.Sequential(dispatched)
    expect_true(acc.verify_device_map(outer) is True, "verify_device_map(module containing a dispatched model)")
    if world.size > 1:
        error = expect_raises(lambda: acc.prepare(dispatched), ValueError, "prepare(dispatched model) at several processes")
        expect_true("device_map" in str(error) or "device map" in str(error), f"the error should name the device map: {error}")


@case("prepare.evaluation_mode")
def prepare_evaluation_mode(impl, world):
    """``prepare_model(model, evaluation_mode=True)`` applies no DDP wrapper, only mixed precision."""
    acc = impl.Accelerator(mixed_precision="bf16")
    model = MyModel()
    dtypes = record_output_dtypes(model.linear)
    prepared = acc.prepare_model(model, evaluation_mode=True)
    expect_true(not isinstance(prepared, torch.nn.parallel.DistributedDataParallel), "evaluation_mode=True wrapped the model in DDP")
    expect_true(acc.unwrap_model(prepared) is model, "unwrap_model(model prepared for evaluation)")
    with torch.no_grad():
        prepared(torch.ones(2, FEATURES, device=acc.device))
    expect_equal(dtypes, [autocast_dtype(acc, torch.bfloat16)], "dtype of the inner Linear's output under mixed_precision='bf16'")
