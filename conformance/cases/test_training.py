"""Catalog section "Training".

Numerical cases train a tiny ``nn.Linear`` on rows of a fixed table (`_DATA`)
picked by index, so every rank can say which samples it trained on. Each
rank returns what it saw (indices, gradients, weights, ``sync_gradients``)
and the driver-side check replays the same training in one process on the
full batch (`_replay`) and compares: no number in this module was copied
from a run. The ``gather_for_metrics.*`` rows live with the data loading
cases.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import random
import socket
import time
import weakref
from datetime import timedelta
from typing import Any, Iterable

import torch

from ..case import ANY_WORLD
from ..case import case as _case
from ..checks import expect_equal, expect_raises, expect_true

#: Building the first DDP model in a process loads ``torch._dynamo`` (2-6 s on
#: a busy 2-core machine), which counts against whichever model case comes
#: first; the training cases get room for it.
MODEL_CASE_TIMEOUT = 30.0


def case(catalog_id: str, **options: Any):
    """`conformance.case.case` with the training cases' timeout."""
    return _case(catalog_id, **{"timeout": MODEL_CASE_TIMEOUT, **options})


DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")
LR = 0.1
BATCH = 2
FEATURES = 4
#: The input table: row i is sample i (x: FEATURES values, y: one target). Enough rows for 2x4 worlds.
_DATA = torch.randn(256, FEATURES + 1, generator=torch.Generator().manual_seed(1234))


# -- shared helpers ------------------------------------------------------------


def _samples(indices: Any, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of the samples at ``indices`` (a tensor or list of ints), on ``device``."""
    rows = _DATA[torch.as_tensor(indices).cpu().long()]
    return rows[:, :FEATURES].to(device), rows[:, FEATURES:].to(device)


def _loss(model: Any, indices: Any, device: Any = "cpu") -> torch.Tensor:
    x, y = _samples(indices, device)
    return torch.nn.functional.mse_loss(model(x), y)


def _linear(seed: int = 0) -> torch.nn.Linear:
    """The model every rank builds identically (the replay builds it again)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(FEATURES, 1)


def _weights(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()]).tolist()


def _grads(model: torch.nn.Module) -> list[float]:
    return torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().float().reshape(-1) for p in model.parameters()]
    ).tolist()


def _close(got: list[float], expected: list[float], what: str, tolerance: float = 1e-5) -> None:
    worst = max((abs(g - e) for g, e in zip(got, expected)), default=0.0)
    if len(got) != len(expected) or worst > tolerance * max(1.0, max(map(abs, expected), default=1.0)):
        raise AssertionError(f"{what}: expected {expected}, got {got} (largest difference {worst:.3g})")


def _local_gradient(weights: list[float], indices: Iterable[int], scale: float = 1.0) -> torch.Tensor:
    """Gradient of ``scale * mse`` over ``indices`` at ``weights``, computed in this process."""
    model = _linear()
    torch.nn.utils.vector_to_parameters(torch.tensor(weights), model.parameters())
    (scale * _loss(model, list(indices))).backward()
    return torch.nn.utils.parameters_to_vector([p.grad for p in model.parameters()])


def _replay(initial: list[float], micro_steps: list[list[list[int]]], syncs: list[bool], num_steps: int) -> dict:
    """One process replaying data-parallel SGD with gradient accumulation.

    ``micro_steps[k][r]`` are the indices rank r trained on at micro-step k;
    each micro-step adds ``1/num_steps`` of rank r's local gradient to rank
    r's accumulator; where ``syncs[k]`` the update uses the mean of the
    accumulators over ranks. That is the full-batch gradient when all
    batches have the same size. Returns the expected gradient each rank
    holds after each micro-step's backward, and the final weights.
    """
    weights = torch.tensor(initial)
    ranks = len(micro_steps[0])
    accumulated = [torch.zeros_like(weights) for _ in range(ranks)]
    grads_seen = []
    for batches, sync in zip(micro_steps, syncs):
        for rank, indices in enumerate(batches):
            accumulated[rank] += _local_gradient(weights.tolist(), indices, 1.0 / num_steps)
        if sync:
            mean = sum(accumulated) / ranks
            grads_seen.append([mean.tolist()] * ranks)
            weights = weights - LR * mean
            accumulated = [torch.zeros_like(weights) for _ in range(ranks)]
        else:
            grads_seen.append([g.tolist() for g in accumulated])
    return {"grads": grads_seen, "final": weights.tolist()}


def _train(acc: Any, model: Any, optimizer: Any, batches: Iterable[Any], accumulate: bool) -> dict:
    """The documented loop; records per micro-step indices, sync_gradients, gradients and whether weights moved."""
    record: dict[str, list] = {"indices": [], "sync": [], "grads": [], "moved": []}
    for indices in batches:
        with acc.accumulate(model) if accumulate else contextlib.nullcontext():
            before = _weights(acc.unwrap_model(model))
            acc.backward(_loss(model, indices, acc.device))
            record["grads"].append(_grads(acc.unwrap_model(model)))
            record["sync"].append(bool(acc.sync_gradients))
            optimizer.step()
            optimizer.zero_grad()
            record["moved"].append(_weights(acc.unwrap_model(model)) != before)
            record["indices"].append(torch.as_tensor(indices).cpu().tolist())
    record["final"] = _weights(acc.unwrap_model(model))
    return record


def _check_against_replay(values: list[dict], world: Any, num_steps: int) -> None:
    """Every rank's gradients after each backward and final weights match the one-process replay."""
    micro_steps = [list(step) for step in zip(*(v["indices"] for v in values))]
    lengths = {len(v["indices"]) for v in values}
    expect_equal(len(lengths), 1, f"ranks trained on different numbers of batches: {[len(v['indices']) for v in values]}")
    expected = _replay(values[0]["initial"], micro_steps, values[0]["sync"], num_steps)
    for rank, value in enumerate(values):
        expect_equal(value["sync"], values[0]["sync"], f"rank {rank}: sync_gradients per step (rank 0 saw {values[0]['sync']})")
        for step, grad in enumerate(value["grads"]):
            what = "synchronised (mean over ranks)" if value["sync"][step] else "local to the rank"
            _close(grad, expected["grads"][step][rank], f"rank {rank}: gradient after backward of micro-step {step + 1}, {what}")
        _close(value["final"], expected["final"], f"rank {rank}: final weights vs one process on the full batch")


def _index_batches(world: Any, count: int, batch: int = BATCH) -> list[torch.Tensor]:
    """``count`` batches for this rank, cut from consecutive global steps as a sharded loader would."""
    n, r = world.size, world.rank
    return [torch.arange((k * n + r) * batch, (k * n + r + 1) * batch) for k in range(count)]


def _sgd(model: Any) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=LR)


# -- prepare -------------------------------------------------------------------


class _Recorder(torch.nn.Linear):
    """An nn.Linear that counts how often it was moved or converted (``Module._apply``: ``.to``, ``.cuda``, ...)."""

    def __init__(self) -> None:
        super().__init__(FEATURES, 1)
        self.moves = 0

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.moves += 1
        return super()._apply(fn, *args, **kwargs)


class _MovableBatch:
    """A batch that records whether it was sent to a device (it has ``.to``, as tensors do)."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.sent_to: list[str] = []

    def to(self, device: Any, non_blocking: bool = False) -> "_MovableBatch":
        self.sent_to.append(str(device))
        return self


def _movable_loader(size: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(list(range(size)), batch_size=BATCH, collate_fn=_MovableBatch)


def _training_objects(recorder: bool = False) -> tuple[Any, Any, Any, Any]:
    model = _Recorder() if recorder else _linear()
    optimizer = _sgd(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=BATCH)
    return model, optimizer, loader, scheduler


@case("prepare.order")
def prepare_order(impl, world):
    """``prepare(model, optimizer, data_loader, scheduler)`` returns them in the same order, prepared.

    Any order works (a scheduler before its optimizer included); an object
    prepare does not know comes back unchanged; one object comes back alone.
    """
    acc = impl.Accelerator()
    model, optimizer, loader, scheduler = _training_objects()
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

    model2, optimizer2, loader2, scheduler2 = _training_objects()
    marker, number = object(), 42
    got = acc.prepare(loader2, scheduler2, marker, model2, number, optimizer2)
    kinds = [type(x).__name__ for x in got]
    expect_true(got[2] is marker and got[4] is number, f"unknown objects should come back unchanged in place, got {kinds}")
    expect_true(acc.unwrap_model(got[3]) is model2, f"model in 4th position, got {kinds}")
    expect_equal(got[1].get_last_lr(), scheduler2.get_last_lr(), "scheduler passed before its optimizer")
    expect_true(isinstance(got[5], torch.optim.Optimizer), f"optimizer in 6th position, got {kinds}")
    single = acc.prepare(_linear())
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
    model, optimizer, _, scheduler = _training_objects(recorder=True)
    loader = _movable_loader(8)
    p_model, _, p_loader, _ = acc.prepare(model, optimizer, loader, scheduler, device_placement=[True, True, False, False])
    expect_true(model.moves >= 1, "device_placement=[True, ...]: the model should have been moved to the device")
    on_device = torch.empty(0, device=acc.device).device  # how a tensor there reports it ("cpu", not "cpu:0")
    expect_true(all(p.device == on_device for p in model.parameters()), "placed model's parameters on accelerator.device")
    expect_equal(next(iter(p_loader)).sent_to, [], "device_placement=[..., False, False]: batches sent to a device")

    model2, optimizer2, _, scheduler2 = _training_objects(recorder=True)
    p_model2, _, p_loader2, _ = acc.prepare(
        model2, optimizer2, _movable_loader(8), scheduler2, device_placement=[False, False, True, True]
    )
    expect_equal(model2.moves, 0, "device_placement=[False, ...]: times the model was moved or converted")
    expect_equal(next(iter(p_loader2)).sent_to, [str(acc.device)], "device_placement=[..., True, True]: batches sent to")
    expect_raises(
        lambda: acc.prepare(_linear(), _linear(), device_placement=[True]), (ValueError, TypeError),
        "device_placement with 1 flag for 2 objects",
    )


def _twin_step(acc: Any, model: Any, optimizer: Any, indices: Any) -> list[float]:
    acc.backward(_loss(model, indices, acc.device))
    optimizer.step()
    optimizer.zero_grad()
    return _weights(acc.unwrap_model(model))


@case("prepare.single_methods")
def prepare_single_methods(impl, world):
    """``prepare_model``, ``prepare_optimizer``, ``prepare_scheduler``, ``prepare_data_loader`` work alone.

    Each gives what ``prepare`` gives for a twin object: the same type, the
    same batches, and one training step with the same result.
    """
    acc = impl.Accelerator()
    model, optimizer, loader, scheduler = _training_objects()
    twin = acc.prepare(*_training_objects())
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


class MyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


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
    dtypes = _record_output_dtypes(model.linear)
    prepared = acc.prepare_model(model, evaluation_mode=True)
    expect_true(not isinstance(prepared, torch.nn.parallel.DistributedDataParallel), "evaluation_mode=True wrapped the model in DDP")
    expect_true(acc.unwrap_model(prepared) is model, "unwrap_model(model prepared for evaluation)")
    with torch.no_grad():
        prepared(torch.ones(2, FEATURES, device=acc.device))
    expect_equal(dtypes, [_autocast_dtype(acc, torch.bfloat16)], "dtype of the inner Linear's output under mixed_precision='bf16'")


# -- training ---------------------------------------------------------------------

STEPS = 3


@case("train.ddp_equivalence")
def train_ddp_equivalence(impl, world):
    """``STEPS`` prepared steps on N ranks give the weights of one process training on the full batch.

    Each rank reports the samples of each of its batches; the check replays
    SGD in one process on the union of every step's batches.
    """
    acc = impl.Accelerator()
    model = _linear()
    initial = _weights(model)
    loader = torch.utils.data.DataLoader(list(range(STEPS * BATCH * world.size)), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, _sgd(model), loader)
    return {"initial": initial, **_train(acc, model, optimizer, loader, accumulate=False)}


@train_ddp_equivalence.check
def _same_as_one_process(values, world):
    expect_equal([len(v["indices"]) for v in values], [STEPS] * world.size, "steps each rank trained")
    seen = sorted(i for v in values for batch in v["indices"] for i in batch)
    expect_equal(seen, list(range(STEPS * BATCH * world.size)), "samples trained on, over all ranks")
    _check_against_replay(values, world, num_steps=1)


@case("backward.loss")
def backward_loss(impl, world):
    """``accelerator.backward(loss)`` fills gradients like ``loss.backward()``; ``kwargs`` reach it."""
    acc = impl.Accelerator()
    model, twin = _linear().to(acc.device), _linear()
    indices = list(range(BATCH * world.rank, BATCH * (world.rank + 1)))
    _loss(twin, indices).backward()
    acc.backward(_loss(model, indices, acc.device))
    _close(_grads(model), _grads(twin), "gradients after accelerator.backward(loss) vs loss.backward()")
    loss = _loss(model, indices, acc.device)
    acc.backward(loss, retain_graph=True)
    acc.backward(loss)
    _close(_grads(model), [3 * g for g in _grads(twin)], "gradients after two more backward passes (retain_graph=True)")


@case("backward.loss")
def backward_loss_scaled_under_accumulation(impl, world):
    """With ``gradient_accumulation_steps=2`` the gradients are those of ``loss / 2``."""
    acc = impl.Accelerator(gradient_accumulation_steps=2)
    model, twin = _linear().to(acc.device), _linear()
    indices = list(range(BATCH * world.rank, BATCH * (world.rank + 1)))
    (_loss(twin, indices) / 2).backward()
    acc.backward(_loss(model, indices, acc.device))
    _close(_grads(model), _grads(twin), "gradients after accelerator.backward(loss) with 2 accumulation steps vs (loss / 2).backward()")


# -- accumulation -------------------------------------------------------------------


@case("accumulate.doc_example")
def accumulate_doc_example(impl, world):
    """``gradient_accumulation_steps=2`` with ``accumulate(model)``: updates every 2nd batch, as with batches twice as big.

    Erratum: the example calls ``loss.backward()`` inside the block;
    ``accelerator.backward(loss)`` is what the document prescribes elsewhere.
    Each rank has 4 batches (the loader ends on a cycle boundary). The check
    asserts ``sync_gradients`` [False, True, False, True], weights moving
    only then, gradients local to the rank on the 1st and 3rd batch and the
    mean over ranks on the 2nd and 4th, and final weights equal to one
    process training on batches twice as big (2 x ranks x batch size).
    """
    acc = impl.Accelerator(gradient_accumulation_steps=2)
    model = _linear()
    initial = _weights(model)
    loader = torch.utils.data.DataLoader(list(range(4 * BATCH * world.size)), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, _sgd(model), loader)
    return {"initial": initial, **_train(acc, model, optimizer, loader, accumulate=True)}


def _check_accumulation(values: list[dict], world: Any, syncs: list[bool]) -> None:
    for rank, value in enumerate(values):
        expect_equal(value["sync"], syncs, f"rank {rank}: accelerator.sync_gradients per batch")
        expect_equal(value["moved"], syncs, f"rank {rank}: weights changed by optimizer.step() per batch")
    _check_against_replay(values, world, num_steps=2)


@accumulate_doc_example.check
def _accumulate_doc_example_check(values, world):
    _check_accumulation(values, world, [False, True, False, True])


@case("accumulate.plugin")
def accumulate_plugin(impl, world):
    """``GradientAccumulationPlugin(num_steps=2)`` behaves as ``gradient_accumulation_steps=2``; passing both is an error.

    No data loader: four batches cut by hand, so only ``num_steps`` decides.
    """
    plugin = impl.utils.GradientAccumulationPlugin
    expect_raises(
        lambda: impl.Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=plugin(num_steps=2)),
        ValueError,
        "Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=...)",
    )
    acc = impl.Accelerator(gradient_accumulation_plugin=plugin(num_steps=2))
    expect_equal(acc.gradient_accumulation_steps, 2, "accelerator.gradient_accumulation_steps")
    model = _linear()
    initial = _weights(model)
    model, optimizer = acc.prepare(model, _sgd(model))
    return {"initial": initial, **_train(acc, model, optimizer, _index_batches(world, 4), accumulate=True)}


@accumulate_plugin.check
def _accumulate_plugin_check(values, world):
    _check_accumulation(values, world, [False, True, False, True])


@case("accumulate.end_of_dataloader")
def accumulate_end_of_dataloader(impl, world):
    """With ``sync_with_dataloader=True`` the last batch of the loader syncs even mid-cycle.

    3 batches per rank and 2 accumulation steps, over 2 epochs: sync on the
    2nd and 3rd batch of each epoch (the count restarts with the epoch).
    """
    plugin = impl.utils.GradientAccumulationPlugin(num_steps=2, sync_with_dataloader=True)
    acc = impl.Accelerator(gradient_accumulation_plugin=plugin)
    model = _linear()
    initial = _weights(model)
    loader = torch.utils.data.DataLoader(list(range(3 * BATCH * world.size)), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, _sgd(model), loader)
    epochs = [_train(acc, model, optimizer, loader, accumulate=True) for _ in range(2)]
    joined = {key: epochs[0][key] + epochs[1][key] for key in ("indices", "sync", "grads", "moved")}
    return {"initial": initial, **joined, "final": epochs[1]["final"]}


@accumulate_end_of_dataloader.check
def _accumulate_end_of_dataloader_check(values, world):
    _check_accumulation(values, world, [False, True, True] * 2)


def _learning_rates(acc: Any, model: Any, optimizer: Any, scheduler: Any, batches: list[Any]) -> list[float]:
    rates = []
    for indices in batches:
        with acc.accumulate(model):
            acc.backward(_loss(model, indices, acc.device))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            rates.append(scheduler.get_last_lr()[0])
    return rates


def _halving(optimizer: Any) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


@case("accumulate.scheduler")
def accumulate_scheduler(impl, world):
    """A prepared scheduler steps only with the optimizer's real updates (``adjust_scheduler=True``).

    ``split_batches=True`` keeps the script's batch size the global one, so
    one update is one scheduler step at any world; the learning rate halves
    per scheduler step, so it shows how many steps were taken.
    """
    plugin = impl.utils.GradientAccumulationPlugin(num_steps=2, adjust_scheduler=True)
    acc = impl.Accelerator(
        gradient_accumulation_plugin=plugin, dataloader_config=impl.DataLoaderConfiguration(split_batches=True)
    )
    model = _linear()
    optimizer = _sgd(model)
    model, optimizer, scheduler = acc.prepare(model, optimizer, _halving(optimizer))
    rates = _learning_rates(acc, model, optimizer, scheduler, _index_batches(world, 6))
    expected = [LR * 0.5 ** ((k + 1) // 2) for k in range(6)]
    expect_equal(rates, expected, "learning rate after each of 6 batches, 2 accumulation steps")


@case("accumulate.scheduler")
def accumulate_scheduler_not_with_optimizer(impl, world):
    """``step_scheduler_with_optimizer=False``: every ``scheduler.step()`` steps, accumulating or not."""
    acc = impl.Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    model = _linear()
    optimizer = _sgd(model)
    model, optimizer, scheduler = acc.prepare(model, optimizer, _halving(optimizer))
    rates = _learning_rates(acc, model, optimizer, scheduler, _index_batches(world, 4))
    expect_equal(rates, [LR * 0.5 ** (k + 1) for k in range(4)], "learning rate after each of 4 batches")


# -- no_sync ---------------------------------------------------------------------------


def _batch_pair(world: Any) -> tuple[list[int], list[int]]:
    """Two batches of this rank (a, b), different on every rank."""
    a, b = _index_batches(world, 2)
    return a.tolist(), b.tolist()


def _local_sum(initial: list[float], *batches: list[int]) -> list[float]:
    return sum(_local_gradient(initial, batch) for batch in batches).tolist()


@case("no_sync.doc_example", worlds=ANY_WORLD)
def no_sync_doc_example(impl, world):
    """Inside ``no_sync(model)`` gradients stay local; the next backward outside synchronises.

    Erratum: the example calls ``accelerator.no_sync()`` without its model
    and calls backward on the first loss again; the signature is
    ``no_sync(model)`` and the second backward is of the second batch's loss.
    """
    acc = impl.Accelerator()
    model = _linear()
    initial = _weights(model)
    model, optimizer = acc.prepare(model, _sgd(model))
    input_a, input_b = _batch_pair(world)
    with acc.no_sync(model):
        acc.backward(_loss(model, input_a, acc.device))
    local = _grads(acc.unwrap_model(model))
    acc.backward(_loss(model, input_b, acc.device))
    return {
        "local": local,
        "synced": _grads(acc.unwrap_model(model)),
        "expected_local": _local_sum(initial, input_a),
        "expected_sum": _local_sum(initial, input_a, input_b),
    }


def _check_local_then_synced(values: list[dict], first: str, second: str) -> None:
    mean = [sum(column) / len(values) for column in zip(*(v["expected_sum"] for v in values))]
    for rank, value in enumerate(values):
        _close(value["local"], value["expected_local"], f"rank {rank}: gradients after {first} (local to the rank)")
        _close(value["synced"], mean, f"rank {rank}: gradients after {second} (mean over ranks of both batches)")


@no_sync_doc_example.check
def _no_sync_check(values, world):
    _check_local_then_synced(values, "backward inside no_sync(model)", "the next backward outside")


@case("no_sync.trigger_sync_in_backward", worlds=ANY_WORLD)
def trigger_sync_in_backward(impl, world):
    """After two forwards under ``no_sync``, the backward inside ``trigger_sync_in_backward(model)`` synchronises."""
    acc = impl.Accelerator()
    model = _linear()
    initial = _weights(model)
    model, optimizer = acc.prepare(model, _sgd(model))
    input_a, input_b = _batch_pair(world)
    with acc.no_sync(model):
        loss_a = _loss(model, input_a, acc.device)
        loss_b = _loss(model, input_b, acc.device)
    acc.backward(loss_a)
    local = _grads(acc.unwrap_model(model))
    with acc.trigger_sync_in_backward(model):
        acc.backward(loss_b)
    return {
        "local": local,
        "synced": _grads(acc.unwrap_model(model)),
        "expected_local": _local_sum(initial, input_a),
        "expected_sum": _local_sum(initial, input_a, input_b),
    }


@trigger_sync_in_backward.check
def _trigger_sync_check(values, world):
    _check_local_then_synced(values, "backward(loss_a) after the forwards under no_sync",
                             "backward(loss_b) inside trigger_sync_in_backward(model)")


# -- clipping and unscaling ----------------------------------------------------------------


def _set_grads(model: torch.nn.Module, rank: int) -> list[torch.Tensor]:
    """Give every parameter a known gradient (different per rank) and return copies."""
    for i, parameter in enumerate(model.parameters()):
        parameter.grad = torch.linspace(-3.0, 2.0 + rank, parameter.numel(), device=parameter.device).reshape(parameter.shape) * (i + 1)
    return [p.grad.clone() for p in model.parameters()]


def _clones(grads: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    return params


@case("clip.grad_norm")
def clip_grad_norm(impl, world):
    """``clip_grad_norm_`` returns the total norm and clips like ``torch.nn.utils.clip_grad_norm_`` (norm types 2 and inf)."""
    acc = impl.Accelerator()
    model, optimizer = acc.prepare(_linear(), _sgd(_linear()))
    params = list(acc.unwrap_model(model).parameters())
    for norm_type, max_norm in ((2, 1.0), (float("inf"), 0.5), (2, 1e6)):
        twins = _clones(_set_grads(acc.unwrap_model(model), world.rank))
        expected_norm = torch.nn.utils.clip_grad_norm_(twins, max_norm, norm_type=norm_type)
        norm = acc.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        what = f"clip_grad_norm_(max_norm={max_norm}, norm_type={norm_type})"
        _close([float(norm)], [float(expected_norm)], f"total norm returned by {what}")
        _close(torch.cat([p.grad.reshape(-1) for p in params]).tolist(),
               torch.cat([p.grad.reshape(-1) for p in twins]).tolist(), f"gradients after {what}")


@case("clip.grad_norm")
def clip_grad_norm_after_unscaling(impl, world):
    """Under ``mixed_precision="fp16"`` the norm is that of the unscaled gradients, and clipping applies to them.

    Every rank trains on the same samples, so synchronised gradients equal
    one process's. The expected gradients come from the same forward under
    ``accelerator.autocast()`` without loss scaling.
    """
    acc = impl.Accelerator(mixed_precision="fp16")
    model, twin = _linear(), _linear()
    model, optimizer = acc.prepare(model, _sgd(model))
    indices = list(range(BATCH))
    acc.backward(_loss(model, indices, acc.device))
    with acc.autocast():
        _loss(twin.to(acc.device), indices, acc.device).backward()
    expected = torch.nn.utils.clip_grad_norm_(list(twin.parameters()), 1e9)
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=float(expected) / 2)
    _close([float(norm)], [float(expected)], "total norm clip_grad_norm_ returns under fp16 (unscaled)", tolerance=1e-2)
    _close(_grads(acc.unwrap_model(model)), [g / 2 for g in _grads(twin)],
           "gradients clipped to half their norm under fp16 (unscaled)", tolerance=1e-2)


@case("clip.grad_value")
def clip_grad_value(impl, world):
    """``clip_grad_value_`` clips like ``torch.nn.utils.clip_grad_value_``."""
    acc = impl.Accelerator()
    model, optimizer = acc.prepare(_linear(), _sgd(_linear()))
    params = list(acc.unwrap_model(model).parameters())
    twins = _clones(_set_grads(acc.unwrap_model(model), world.rank))
    torch.nn.utils.clip_grad_value_(twins, 1.5)
    acc.clip_grad_value_(params, 1.5)
    expect_equal([p.grad.tolist() for p in params], [p.grad.tolist() for p in twins], "gradients after clip_grad_value_(clip_value=1.5)")


@case("unscale.noop")
def unscale_noop(impl, world):
    """Without mixed precision ``unscale_gradients`` (all optimizers, or the one given) changes nothing."""
    acc = impl.Accelerator()
    model = _linear()
    model, optimizer = acc.prepare(model, _sgd(model))
    acc.backward(_loss(model, _index_batches(world, 1)[0], acc.device))
    before = _grads(acc.unwrap_model(model))
    acc.unscale_gradients()
    acc.unscale_gradients(optimizer=optimizer)
    acc.unscale_gradients(optimizer=[optimizer])
    expect_equal(_grads(acc.unwrap_model(model)), before, "gradients after unscale_gradients() without AMP")


# -- mixed precision --------------------------------------------------------------------------


class _DtypeRecorder:
    """A forward hook that records its module's output dtype (a class, so the module still pickles)."""

    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []

    def __call__(self, module: Any, inputs: Any, output: torch.Tensor) -> None:
        self.dtypes.append(output.dtype)


def _record_output_dtypes(module: torch.nn.Module) -> list[torch.dtype]:
    recorder = _DtypeRecorder()
    module.register_forward_hook(recorder)
    return recorder.dtypes


def _autocast_dtype(acc: Any, dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's own autocast gives an ``nn.Linear`` output on the accelerator's device."""
    with torch.autocast(device_type=acc.device.type, dtype=dtype):
        return torch.nn.Linear(2, 2).to(acc.device)(torch.ones(1, 2, device=acc.device)).dtype


def _matmul_dtype(acc: Any) -> torch.dtype:
    a = torch.ones(2, 2, device=acc.device)
    return (a @ a).dtype


@case("autocast.bf16")
def autocast_bf16(impl, world):
    """``mixed_precision="bf16"``: forwards autocast to bf16 where torch does; ``autocast()`` and ``AutocastKwargs`` work.

    ``autocast(autocast_handler=AutocastKwargs(enabled=False))`` inside an
    autocast block reverts it to fp32, as the document suggests.
    """
    acc = impl.Accelerator(mixed_precision="bf16")
    expect_equal(acc.mixed_precision, "bf16", "accelerator.mixed_precision")
    model = MyModel()
    dtypes = _record_output_dtypes(model.linear)
    prepared = acc.prepare(model)
    prepared(torch.ones(2, FEATURES, device=acc.device))
    expect_equal(dtypes, [_autocast_dtype(acc, torch.bfloat16)], "dtype of the prepared model's inner Linear output")
    expect_equal(_matmul_dtype(acc), torch.float32, "matmul dtype outside accelerator.autocast()")
    with acc.autocast():
        expect_equal(_matmul_dtype(acc), torch.bfloat16, "matmul dtype inside accelerator.autocast()")
        with acc.autocast(autocast_handler=impl.AutocastKwargs(enabled=False)):
            expect_equal(_matmul_dtype(acc), torch.float32, "matmul dtype inside autocast(AutocastKwargs(enabled=False))")


@case("autocast.bf16")
def autocast_kwargs_handler(impl, world):
    """``AutocastKwargs`` given to the Accelerator applies to ``autocast()`` and to prepared models."""
    acc = impl.Accelerator(mixed_precision="bf16", kwargs_handlers=[impl.AutocastKwargs(enabled=False)])
    with acc.autocast():
        expect_equal(_matmul_dtype(acc), torch.float32, "matmul dtype inside autocast() with AutocastKwargs(enabled=False)")
    model = MyModel()
    dtypes = _record_output_dtypes(model.linear)
    acc.prepare(model)(torch.ones(2, FEATURES, device=acc.device))
    expect_equal(dtypes, [torch.float32], "inner Linear output dtype with AutocastKwargs(enabled=False)")


@case("unwrap.keep_fp32_wrapper")
def unwrap_keep_fp32_wrapper(impl, world):
    """``unwrap_model(model, keep_fp32_wrapper=False)`` removes the mixed-precision forward wrapper.

    Under ``mixed_precision="bf16"`` the unwrapped model keeps autocasting
    by default (its inner Linear computes in bf16); with
    ``keep_fp32_wrapper=False`` its forward is the user's again: fp32
    inside, and the model pickles and reloads.
    """
    acc = impl.Accelerator(mixed_precision="bf16")
    model = MyModel()
    dtypes = _record_output_dtypes(model.linear)
    prepared = acc.prepare(model)
    x = torch.ones(2, FEATURES, device=acc.device)
    acc.unwrap_model(prepared)(x)
    expect_equal(dtypes, [_autocast_dtype(acc, torch.bfloat16)], "inner Linear dtype with the wrapper kept (default)")
    bare = acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    expect_true(bare is model, "unwrap_model(..., keep_fp32_wrapper=False) should return the user's model")
    dtypes.clear()
    out = bare(x)
    expect_equal([dtypes, out.dtype], [[torch.float32], torch.float32], "inner and output dtypes without the wrapper")
    reloaded = pickle.loads(pickle.dumps(bare))
    expect_equal(_weights(reloaded), _weights(model), "weights of the model pickled after unwrapping")


@case("autocast.fp16_scaler")
def autocast_fp16_scaler(impl, world):
    """``mixed_precision="fp16"`` scales the loss with a GradScaler configured by ``GradScalerKwargs``; overflow skips a step.

    Erratum: the utilities reference writes ``GradScalerKwargs(backoff_filter=0.25)``;
    the field is ``backoff_factor``. Gradients after backward are the true
    ones times the scale: ``init_scale`` first, ``init_scale *
    backoff_factor`` after the overflowing step, whose update is skipped
    (weights unchanged, ``optimizer_step_was_skipped`` True). Every rank
    trains on the same samples, so synchronised gradients are one process's.
    """
    handler = impl.GradScalerKwargs(init_scale=1024.0, backoff_factor=0.25, growth_interval=1000)
    acc = impl.Accelerator(mixed_precision="fp16", kwargs_handlers=[handler])
    model = _linear()
    model, optimizer = acc.prepare(model, _sgd(model))
    indices = list(range(BATCH))

    def scale_seen() -> float:
        """Ratio of the gradients after accelerator.backward to the true ones (twin at the same weights)."""
        twin = _linear()
        torch.nn.utils.vector_to_parameters(torch.tensor(_weights(acc.unwrap_model(model))), twin.parameters())
        twin = twin.to(acc.device)  # set on the host: XLA parameters take no host data (set_data)
        with acc.autocast():
            _loss(twin, indices, acc.device).backward()
        acc.backward(_loss(model, indices, acc.device))
        got, true = torch.tensor(_grads(acc.unwrap_model(model))), torch.tensor(_grads(twin))
        return float(got.norm() / true.norm())

    first = scale_seen()
    expect_true(abs(first / 1024.0 - 1) < 1e-2, f"gradients should be scaled by init_scale=1024, scaled by {first:.4g}")
    before = _weights(acc.unwrap_model(model))
    optimizer.step()
    optimizer.zero_grad()
    expect_true(acc.optimizer_step_was_skipped is False, "optimizer_step_was_skipped after a finite step")
    expect_true(_weights(acc.unwrap_model(model)) != before, "a finite step should update the weights")

    before = _weights(acc.unwrap_model(model))
    acc.backward(_loss(model, indices, acc.device) * float("inf"))
    optimizer.step()
    optimizer.zero_grad()
    expect_true(acc.optimizer_step_was_skipped is True, "optimizer_step_was_skipped after an overflowing step")
    expect_equal(_weights(acc.unwrap_model(model)), before, "weights after the skipped (overflowing) step")

    second = scale_seen()
    expect_true(abs(second / 256.0 - 1) < 1e-2, f"after overflow the scale should be 1024 * backoff_factor 0.25 = 256, got {second:.4g}")
    optimizer.step()
    expect_true(acc.optimizer_step_was_skipped is False, "optimizer_step_was_skipped after the next finite step")


# -- uneven inputs -------------------------------------------------------------------------------


def _uneven_steps(acc: Any, model: Any, optimizer: Any, batches: Iterable[Any]) -> int:
    count = 0
    for indices in batches:
        acc.backward(_loss(model, indices, acc.device))
        optimizer.step()
        optimizer.zero_grad()
        count += 1
    return count


@case("join.uneven_inputs", worlds=["1", "2", "3"], timeout=15.0)  # HF hangs here: keep its HANG short
def join_uneven_inputs(impl, world):
    """``join_uneven_inputs([ddp_model], even_batches=False)`` trains to the end when ranks have different batch counts.

    First, rank r trains on r + 1 batches of its own inside the block (an
    implementation whose block does nothing leaves the longer ranks waiting
    in DDP's all-reduce: reported as HANG). Then the documented example: a
    prepared loader of ``2 * ranks + 1`` samples, batch size 1, with
    ``even_batches=False`` given to the block: rank 0 gets 3 batches, the
    others 2; after the block the loader is even again. Weights must agree
    on every rank. A no-op on one process.
    """
    acc = impl.Accelerator()
    model = _linear()
    loader = torch.utils.data.DataLoader(list(range(2 * world.size + 1)), batch_size=1)
    model, optimizer, loader = acc.prepare(model, _sgd(model), loader)
    with acc.join_uneven_inputs([model], even_batches=False):
        own = _uneven_steps(acc, model, optimizer, _index_batches(world, world.rank + 1))
    with acc.join_uneven_inputs([model], even_batches=False):
        inside = _uneven_steps(acc, model, optimizer, loader)
    after = len(list(loader))
    return {"own": own, "inside": inside, "after": after, "weights": _weights(acc.unwrap_model(model))}


@join_uneven_inputs.check
def _joined_to_the_end(values, world):
    n = world.size
    expect_equal([v["own"] for v in values], [r + 1 for r in range(n)], "batches each rank trained on, rank r having r + 1")
    expected_inside = [3] + [2] * (n - 1)
    expect_equal([v["inside"] for v in values], expected_inside, "batches per rank inside join_uneven_inputs(even_batches=False)")
    expect_equal([v["after"] for v in values], [3] * n, "batches per rank after the block (even_batches restored)")
    for rank, value in enumerate(values):
        _close(value["weights"], values[0]["weights"], f"rank {rank}: weights vs rank 0's after joined training")


# -- memory, seeds, profiling -----------------------------------------------------------------------


@case("free_memory.resets")
def free_memory_resets(impl, world):
    """``free_memory()`` drops every reference to prepared objects and resets ``step`` to 0; ``clear`` is its alias.

    Observed with weak references: once the script drops its own names too,
    the prepared model, optimizer and scheduler must be garbage.
    """
    acc = impl.Accelerator(gradient_accumulation_steps=2)
    for release in ("free_memory", "clear"):
        model, optimizer, _, scheduler = _training_objects()
        model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
        for _ in range(3):
            with acc.accumulate(model):
                pass
        expect_equal(acc.step, 3, "accelerator.step after 3 accumulate() blocks")
        alive = [weakref.ref(x) for x in (model, optimizer, scheduler)]
        if release == "free_memory":
            acc.free_memory()
            del model, optimizer, scheduler
        else:
            model, optimizer, scheduler = acc.clear(model, optimizer, scheduler)
            expect_equal([model, optimizer, scheduler], [None, None, None], "what clear(model, optimizer, scheduler) returns")
        gc.collect()
        expect_equal(acc.step, 0, f"accelerator.step after {release}()")
        kept = [name for name, ref in zip(("model", "optimizer", "scheduler"), alive) if ref() is not None]
        expect_equal(kept, [], f"prepared objects still referenced after {release}() and del")


def _draws() -> list[float]:
    import numpy

    return [random.random(), float(numpy.random.rand()), torch.rand(1).item()]


@case("seed.set_seed")
def set_seed(impl, world):
    """``set_seed(s)`` makes random, numpy and torch reproducible; ``device_specific=True`` adds the process index."""
    acc = impl.Accelerator()
    impl.utils.set_seed(42)
    first = _draws()
    impl.utils.set_seed(42)
    expect_equal(_draws(), first, "draws of random, numpy and torch after set_seed(42) twice")
    impl.utils.set_seed(42, device_specific=True)
    specific = _draws()
    impl.utils.set_seed(42 + acc.process_index)
    expect_equal(specific, _draws(), "set_seed(42, device_specific=True) vs set_seed(42 + process_index)")
    return {"same": first, "specific": specific}


@set_seed.check
def _seeds_across_ranks(values, world):
    expect_equal([v["same"] for v in values], [values[0]["same"]] * world.size, "set_seed(42) draws on every rank")
    specific = [tuple(v["specific"]) for v in values]
    expect_equal(len(set(specific)), world.size, "set_seed(42, device_specific=True) should differ per rank")


OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes."


@case("memory.find_executable_batch_size", worlds=["1"])
def find_executable_batch_size(impl, world):
    """The decorated function is retried with half the batch size after out-of-memory errors, from ``starting_batch_size``.

    The function must take the batch size first and is called without it;
    an error other than out-of-memory propagates at once.
    """
    impl.Accelerator()
    tried: list[int] = []

    @impl.utils.find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, label):
        tried.append(batch_size)
        if batch_size > 16:
            raise RuntimeError(OUT_OF_MEMORY)
        return batch_size, label

    expect_equal(train("run"), (16, "run"), "what the decorated function returns once a batch size fits")
    expect_equal(tried, [128, 64, 32, 16], "batch sizes tried after out-of-memory errors")

    attempts: list[int] = []

    @impl.utils.find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size):
        attempts.append(batch_size)
        raise KeyError("not a memory problem")

    expect_raises(broken, KeyError, "a non-memory error inside the decorated function")
    expect_equal(attempts, [8], "batch sizes tried when the error is not about memory")


@case("profile.context")
def profile_context(impl, world):
    """``profile()`` yields a torch profiler; ``ProfileKwargs(output_trace_dir=...)`` writes a Chrome trace (A v1.x).

    Erratum: the example passes ``Accelerator(kwarg_handler=[kwargs])``; the
    argument is ``kwargs_handlers``. A ``profile_handler`` given to
    ``profile()`` overrides the Accelerator's (the custom-handler example).
    """
    trace_dir = os.path.join(world.shared_dir, "trace")
    acc = impl.Accelerator(kwargs_handlers=[impl.ProfileKwargs(output_trace_dir=trace_dir)])
    a = torch.ones(8, 8, device=acc.device)
    with acc.profile() as prof:
        a @ a
    expect_true(isinstance(prof, torch.profiler.profile), f"profile() should yield a torch.profiler.profile, got {type(prof).__name__}")
    ops = {event.key for event in prof.key_averages()}
    expect_true("aten::mm" in ops, f"the profile should record aten::mm, recorded {sorted(ops)[:10]}")
    traces = [name for name in os.listdir(trace_dir) if name.endswith(".json")] if os.path.isdir(trace_dir) else []
    expect_true(len(traces) >= 1, f"a Chrome trace (.json) should be written in output_trace_dir, found {traces}")
    with open(os.path.join(trace_dir, traces[0]), encoding="utf-8") as trace:
        expect_true("traceEvents" in json.load(trace), "the trace file should be a Chrome trace (traceEvents)")

    ready: list[int] = []
    handler = impl.ProfileKwargs(schedule_option=dict(wait=1, warmup=1, active=1), on_trace_ready=lambda p: ready.append(1))
    with acc.profile(handler) as prof:
        for _ in range(4):
            a @ a
            prof.step()
    expect_true(len(ready) >= 1, "on_trace_ready of the ProfileKwargs given to profile() should have been called")


# -- kwargs handlers ----------------------------------------------------------------------------------


class _TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Linear(FEATURES, 1)
        self.unused = torch.nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


@case("kwargs.ddp", worlds=DISTRIBUTED_WORLDS)
def kwargs_ddp(impl, world):
    """``DistributedDataParallelKwargs(find_unused_parameters=True)`` reaches the DDP wrapper.

    A model with a parameter the forward never uses trains for two steps
    (DDP without the flag refuses the second); the unused one gets no gradient.
    """
    handler = impl.DistributedDataParallelKwargs(find_unused_parameters=True)
    acc = impl.Accelerator(kwargs_handlers=[handler])
    model = _TwoHeads()
    model, optimizer = acc.prepare(model, _sgd(model))
    expect_true(getattr(model, "find_unused_parameters", None) is True, "prepared DDP model's find_unused_parameters")
    for indices in _index_batches(world, 2):
        acc.backward(_loss(model, indices, acc.device))
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    unused = [p.grad for p in acc.unwrap_model(model).unused.parameters()]
    expect_true(all(g is None or not g.any() for g in unused), "the unused head should get no gradient")


def _agreed_free_port(world: Any, timeout: float = 10.0) -> int:
    """A free loopback port chosen by rank 0 and read by every rank from the case's shared directory."""
    path = os.path.join(world.shared_dir, "master_port")
    if world.rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(str(port))
        os.replace(path + ".tmp", path)
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank {world.rank}: rank 0 wrote no port to {path} within {timeout} s")
        time.sleep(0.01)
    with open(path, encoding="utf-8") as handle:
        return int(handle.read())


@case("kwargs.init_process_group", worlds=DISTRIBUTED_WORLDS)
def kwargs_init_process_group(impl, world):
    """``InitProcessGroupKwargs(timeout=timedelta(seconds=800))`` reaches the process group's creation.

    The rank pool keeps one process group across cases, so this case first
    tears it down (every rank) for the Accelerator to create it again, on a
    fresh port (objects of earlier cases may keep the old group's store
    alive on the old one); the timeout is read back from torch's default group.
    """
    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(_agreed_free_port(world))  # the worker restores the environment after the case
    impl.Accelerator(kwargs_handlers=[impl.InitProcessGroupKwargs(timeout=timedelta(seconds=800))])
    expect_true(dist.is_initialized(), "the Accelerator should have created the process group")
    group = dist.distributed_c10d._get_default_group()
    timeout = group._get_backend(torch.device("cpu")).options._timeout
    expect_equal(timeout.total_seconds(), 800.0, "the default process group's timeout (seconds)")
