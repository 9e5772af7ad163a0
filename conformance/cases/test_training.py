"""Catalog section "Training": training steps, gradient accumulation, ``no_sync`` and clipping.

Numerical cases train a tiny ``nn.Linear`` on rows of a fixed table
(`conformance.support.training.DATA`) picked by index, so every rank can say
which samples it trained on. Each rank returns what it saw (indices,
gradients, weights, ``sync_gradients``) and the driver-side check replays the
same training in one process on the full batch (`replay`) and compares: no
number in this module was copied from a run. The ``gather_for_metrics.*``
rows live with the data loading cases.
"""

from __future__ import annotations

from typing import Any

import torch

from ..engine.case import ANY_WORLD
from ..support import spellings
from ..support.checks import expect_equal, expect_raises

from ..support.training import (
    BATCH,
    LR,
    case,
    check_against_replay,
    expect_close,
    grads_of,
    index_batches,
    local_gradient,
    sample_loss,
    sgd_of,
    tiny_linear,
    train_steps,
    weights_of,
)


STEPS = 3


@case("train.ddp_equivalence")
def train_ddp_equivalence(impl, world):
    """``STEPS`` prepared steps on N ranks give the weights of one process training on the full batch.

    Each rank reports the samples of each of its batches; the check replays
    SGD in one process on the union of every step's batches.
    """
    acc = impl.Accelerator()
    model = tiny_linear()
    initial = weights_of(model)
    loader = torch.utils.data.DataLoader(list(range(STEPS * BATCH * world.size)), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, sgd_of(model), loader)
    return {"initial": initial, **train_steps(acc, model, optimizer, loader, accumulate=False)}


@train_ddp_equivalence.check
def _same_as_one_process(values, world):
    expect_equal([len(v["indices"]) for v in values], [STEPS] * world.size, "steps each rank trained")
    seen = sorted(i for v in values for batch in v["indices"] for i in batch)
    expect_equal(seen, list(range(STEPS * BATCH * world.size)), "samples trained on, over all ranks")
    check_against_replay(values, world, num_steps=1)


@case("backward.loss")
def backward_loss(impl, world):
    """``accelerator.backward(loss)`` fills gradients like ``loss.backward()``; ``kwargs`` reach it."""
    acc = impl.Accelerator()
    model, twin = tiny_linear().to(acc.device), tiny_linear()
    indices = list(range(BATCH * world.rank, BATCH * (world.rank + 1)))
    sample_loss(twin, indices).backward()
    acc.backward(sample_loss(model, indices, acc.device))
    expect_close(grads_of(model), grads_of(twin), "gradients after accelerator.backward(loss) vs loss.backward()")
    loss = sample_loss(model, indices, acc.device)
    acc.backward(loss, retain_graph=True)
    acc.backward(loss)
    expect_close(grads_of(model), [3 * g for g in grads_of(twin)], "gradients after two more backward passes (retain_graph=True)")


@case("backward.loss")
def backward_loss_scaled_under_accumulation(impl, world):
    """With ``gradient_accumulation_steps=2`` the gradients are those of ``loss / 2``."""
    acc = impl.Accelerator(gradient_accumulation_steps=2)
    model, twin = tiny_linear().to(acc.device), tiny_linear()
    indices = list(range(BATCH * world.rank, BATCH * (world.rank + 1)))
    (sample_loss(twin, indices) / 2).backward()
    acc.backward(sample_loss(model, indices, acc.device))
    expect_close(grads_of(model), grads_of(twin), "gradients after accelerator.backward(loss) with 2 accumulation steps vs (loss / 2).backward()")


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
    model = tiny_linear()
    initial = weights_of(model)
    loader = torch.utils.data.DataLoader(list(range(4 * BATCH * world.size)), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, sgd_of(model), loader)
    return {"initial": initial, **train_steps(acc, model, optimizer, loader, accumulate=True)}


def _check_accumulation(values: list[dict], world: Any, syncs: list[bool]) -> None:
    for rank, value in enumerate(values):
        expect_equal(value["sync"], syncs, f"rank {rank}: accelerator.sync_gradients per batch")
        expect_equal(value["moved"], syncs, f"rank {rank}: weights changed by optimizer.step() per batch")
    check_against_replay(values, world, num_steps=2)


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
    model = tiny_linear()
    initial = weights_of(model)
    model, optimizer = acc.prepare(model, sgd_of(model))
    return {"initial": initial, **train_steps(acc, model, optimizer, index_batches(world, 4), accumulate=True)}


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
    model = tiny_linear()
    initial = weights_of(model)
    loader = torch.utils.data.DataLoader(list(range(3 * BATCH * world.size)), batch_size=BATCH)
    model, optimizer, loader = acc.prepare(model, sgd_of(model), loader)
    epochs = [train_steps(acc, model, optimizer, loader, accumulate=True) for _ in range(2)]
    joined = {key: epochs[0][key] + epochs[1][key] for key in ("indices", "sync", "grads", "moved")}
    return {"initial": initial, **joined, "final": epochs[1]["final"]}


@accumulate_end_of_dataloader.check
def _accumulate_end_of_dataloader_check(values, world):
    _check_accumulation(values, world, [False, True, True] * 2)


def _learning_rates(acc: Any, model: Any, optimizer: Any, scheduler: Any, batches: list[Any]) -> list[float]:
    rates = []
    for indices in batches:
        with acc.accumulate(model):
            acc.backward(sample_loss(model, indices, acc.device))
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
    acc = spellings.accelerator(impl, {"split_batches": True}, gradient_accumulation_plugin=plugin)
    model = tiny_linear()
    optimizer = sgd_of(model)
    model, optimizer, scheduler = acc.prepare(model, optimizer, _halving(optimizer))
    rates = _learning_rates(acc, model, optimizer, scheduler, index_batches(world, 6))
    expected = [LR * 0.5 ** ((k + 1) // 2) for k in range(6)]
    expect_equal(rates, expected, "learning rate after each of 6 batches, 2 accumulation steps")


@case("accumulate.scheduler")
def accumulate_scheduler_not_with_optimizer(impl, world):
    """``step_scheduler_with_optimizer=False``: every ``scheduler.step()`` steps, accumulating or not."""
    acc = impl.Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    model = tiny_linear()
    optimizer = sgd_of(model)
    model, optimizer, scheduler = acc.prepare(model, optimizer, _halving(optimizer))
    rates = _learning_rates(acc, model, optimizer, scheduler, index_batches(world, 4))
    expect_equal(rates, [LR * 0.5 ** (k + 1) for k in range(4)], "learning rate after each of 4 batches")


def _batch_pair(world: Any) -> tuple[list[int], list[int]]:
    """Two batches of this rank (a, b), different on every rank."""
    a, b = index_batches(world, 2)
    return a.tolist(), b.tolist()


def _local_sum(initial: list[float], *batches: list[int]) -> list[float]:
    return sum(local_gradient(initial, batch) for batch in batches).tolist()


@case("no_sync.doc_example", worlds=ANY_WORLD)
def no_sync_doc_example(impl, world):
    """Inside ``no_sync(model)`` gradients stay local; the next backward outside synchronises.

    Erratum: the example calls ``accelerator.no_sync()`` without its model
    and calls backward on the first loss again; the signature is
    ``no_sync(model)`` and the second backward is of the second batch's loss.
    """
    acc = impl.Accelerator()
    model = tiny_linear()
    initial = weights_of(model)
    model, optimizer = acc.prepare(model, sgd_of(model))
    input_a, input_b = _batch_pair(world)
    with acc.no_sync(model):
        acc.backward(sample_loss(model, input_a, acc.device))
    local = grads_of(acc.unwrap_model(model))
    acc.backward(sample_loss(model, input_b, acc.device))
    return {
        "local": local,
        "synced": grads_of(acc.unwrap_model(model)),
        "expected_local": _local_sum(initial, input_a),
        "expected_sum": _local_sum(initial, input_a, input_b),
    }


def _check_local_then_synced(values: list[dict], first: str, second: str) -> None:
    mean = [sum(column) / len(values) for column in zip(*(v["expected_sum"] for v in values))]
    for rank, value in enumerate(values):
        expect_close(value["local"], value["expected_local"], f"rank {rank}: gradients after {first} (local to the rank)")
        expect_close(value["synced"], mean, f"rank {rank}: gradients after {second} (mean over ranks of both batches)")


@no_sync_doc_example.check
def _no_sync_check(values, world):
    _check_local_then_synced(values, "backward inside no_sync(model)", "the next backward outside")


@case("no_sync.trigger_sync_in_backward", worlds=ANY_WORLD)
def trigger_sync_in_backward(impl, world):
    """After two forwards under ``no_sync``, the backward inside ``trigger_sync_in_backward(model)`` synchronises."""
    acc = impl.Accelerator()
    model = tiny_linear()
    initial = weights_of(model)
    model, optimizer = acc.prepare(model, sgd_of(model))
    input_a, input_b = _batch_pair(world)
    with acc.no_sync(model):
        loss_a = sample_loss(model, input_a, acc.device)
        loss_b = sample_loss(model, input_b, acc.device)
    acc.backward(loss_a)
    local = grads_of(acc.unwrap_model(model))
    with acc.trigger_sync_in_backward(model):
        acc.backward(loss_b)
    return {
        "local": local,
        "synced": grads_of(acc.unwrap_model(model)),
        "expected_local": _local_sum(initial, input_a),
        "expected_sum": _local_sum(initial, input_a, input_b),
    }


@trigger_sync_in_backward.check
def _trigger_sync_check(values, world):
    _check_local_then_synced(values, "backward(loss_a) after the forwards under no_sync",
                             "backward(loss_b) inside trigger_sync_in_backward(model)")


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
    model, optimizer = acc.prepare(tiny_linear(), sgd_of(tiny_linear()))
    params = list(acc.unwrap_model(model).parameters())
    for norm_type, max_norm in ((2, 1.0), (float("inf"), 0.5), (2, 1e6)):
        twins = _clones(_set_grads(acc.unwrap_model(model), world.rank))
        expected_norm = torch.nn.utils.clip_grad_norm_(twins, max_norm, norm_type=norm_type)
        norm = acc.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        what = f"clip_grad_norm_(max_norm={max_norm}, norm_type={norm_type})"
        expect_close([float(norm)], [float(expected_norm)], f"total norm returned by {what}")
        expect_close(torch.cat([p.grad.reshape(-1) for p in params]).tolist(),
               torch.cat([p.grad.reshape(-1) for p in twins]).tolist(), f"gradients after {what}")


@case("clip.grad_norm")
def clip_grad_norm_after_unscaling(impl, world):
    """Under ``mixed_precision="fp16"`` the norm is that of the unscaled gradients, and clipping applies to them.

    Every rank trains on the same samples, so synchronised gradients equal
    one process's. The expected gradients come from the same forward under
    ``accelerator.autocast()`` without loss scaling.
    """
    acc = impl.Accelerator(mixed_precision="fp16")
    model, twin = tiny_linear(), tiny_linear()
    model, optimizer = acc.prepare(model, sgd_of(model))
    indices = list(range(BATCH))
    acc.backward(sample_loss(model, indices, acc.device))
    with acc.autocast():
        sample_loss(twin.to(acc.device), indices, acc.device).backward()
    expected = torch.nn.utils.clip_grad_norm_(list(twin.parameters()), 1e9)
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=float(expected) / 2)
    expect_close([float(norm)], [float(expected)], "total norm clip_grad_norm_ returns under fp16 (unscaled)", tolerance=1e-2)
    expect_close(grads_of(acc.unwrap_model(model)), [g / 2 for g in grads_of(twin)],
           "gradients clipped to half their norm under fp16 (unscaled)", tolerance=1e-2)


@case("clip.grad_value")
def clip_grad_value(impl, world):
    """``clip_grad_value_`` clips like ``torch.nn.utils.clip_grad_value_``."""
    acc = impl.Accelerator()
    model, optimizer = acc.prepare(tiny_linear(), sgd_of(tiny_linear()))
    params = list(acc.unwrap_model(model).parameters())
    twins = _clones(_set_grads(acc.unwrap_model(model), world.rank))
    torch.nn.utils.clip_grad_value_(twins, 1.5)
    acc.clip_grad_value_(params, 1.5)
    expect_equal([p.grad.tolist() for p in params], [p.grad.tolist() for p in twins], "gradients after clip_grad_value_(clip_value=1.5)")


@case("unscale.noop")
def unscale_noop(impl, world):
    """Without mixed precision ``unscale_gradients`` (all optimizers, or the one given) changes nothing."""
    acc = impl.Accelerator()
    model = tiny_linear()
    model, optimizer = acc.prepare(model, sgd_of(model))
    acc.backward(sample_loss(model, index_batches(world, 1)[0], acc.device))
    before = grads_of(acc.unwrap_model(model))
    acc.unscale_gradients()
    acc.unscale_gradients(optimizer=optimizer)
    acc.unscale_gradients(optimizer=[optimizer])
    expect_equal(grads_of(acc.unwrap_model(model)), before, "gradients after unscale_gradients() without AMP")
