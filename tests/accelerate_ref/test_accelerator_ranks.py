"""The reference's training path across ranks: DDP, synchronisation, joining, mixed precision.

One launch per world runs `training_checks` on every rank; each phase builds a
fresh Accelerator (the process group stays up) and returns what it saw, and
the test compares ranks with each other and with one-process arithmetic.
Catalog: train.ddp_equivalence, accumulate.doc_example, accumulate.plugin, no_sync.*,
join.uneven_inputs, autocast.fp16_scaler, accumulate.scheduler,
prepare.unwrap, prepare.verify_device_map, kwargs.ddp, free_memory.resets,
gather_for_metrics.doc_example.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

import simulators
from accelerate_ref import (
    Accelerator,
    AcceleratorState,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradientState,
    GradScalerKwargs,
)

#: HF 1.15's warning when `join_uneven_inputs(even_batches=...)` meets an iterable dataset's loader.
MAP_STYLE_ONLY = "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given were iterable"


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(4))


def fresh(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


def linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 1)


def loss_of(model, rank: int, step: int) -> torch.Tensor:
    """A loss that differs per rank and step, so local and synchronised gradients differ."""
    x = torch.full((2, 3), float(rank + 1)) + step
    return ((model(x) - rank) ** 2).mean()


def grads(model) -> list[float]:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist()


def weights(model) -> list[float]:
    return torch.nn.utils.parameters_to_vector(model.parameters()).tolist()


def ddp_phase(rank: int) -> dict:
    handler = DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=1)
    acc = fresh(kwargs_handlers=[handler])
    model = acc.prepare(linear())
    mapped = linear()
    mapped.hf_device_map = {"weight": "cpu", "bias": "disk"}
    try:
        acc.prepare(mapped)
        refused = ""
    except ValueError as error:
        refused = str(error)
    return {
        "wrapped": type(model).__name__,
        "unwrapped_is_linear": type(acc.unwrap_model(model)) is torch.nn.Linear,
        "find_unused": model.find_unused_parameters,
        "bucket_bytes": model.bucket_bytes_cap,
        "refused": refused,
    }


def sync_phase(rank: int) -> dict:
    """Accumulation with no_sync, then trigger_sync_in_backward, on a DDP model."""
    acc = fresh(gradient_accumulation_steps=2)
    model = acc.prepare(linear())
    plain = linear()
    seen = {"accumulate": [], "sync": []}
    for step in range(2):
        with acc.accumulate(model):
            acc.backward(loss_of(model, rank, step))
            seen["accumulate"].append(grads(model.module))
            seen["sync"].append(acc.sync_gradients)
    (loss_of(plain, rank, 0) / 2).backward()
    seen["local_first"] = grads(plain)
    plain.zero_grad()
    model.zero_grad()
    with acc.no_sync(model):
        first = loss_of(model, rank, 0)
        second = loss_of(model, rank, 1)
    acc.backward(first)
    seen["after_first"] = grads(model.module)
    with acc.trigger_sync_in_backward(model):
        acc.backward(second)
    seen["after_trigger"] = grads(model.module)
    ((loss_of(plain, rank, 0) + loss_of(plain, rank, 1)) / 2).backward()
    seen["local_sum"] = grads(plain)
    return seen


def sync_each_batch_phase(rank: int) -> list[float]:
    """``sync_each_batch``: even an accumulating micro-step synchronises (the optimizer still waits)."""
    acc = fresh(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=True))
    model = acc.prepare(linear())
    with acc.accumulate(model):
        acc.backward(loss_of(model, rank, 0))
        assert not acc.sync_gradients
    return grads(model.module)


def join_phase(rank: int, size: int) -> dict:
    acc = fresh()
    model = linear()
    loader = torch.utils.data.DataLoader(list(range(2 * size + 1)), batch_size=1)
    model, optimizer, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    acc.prepare(torch.utils.data.DataLoader(Stream(), batch_size=1))  # its even_batches cannot be overridden
    batches = 0
    with warnings.catch_warnings(record=True) as caught, acc.join_uneven_inputs([model], even_batches=False):
        warnings.simplefilter("always")
        for batch in loader:
            acc.backward(loss_of(model, rank, int(batch)))
            optimizer.step()
            optimizer.zero_grad()
            batches += 1
    gathered = [acc.gather_for_metrics(batch).tolist() for batch in loader]
    iterable_warned = any(MAP_STYLE_ONLY in str(warning.message) for warning in caught)
    return {"batches": batches, "after": len(loader), "weights": weights(model.module), "gathered": gathered,
            "iterable_warned": iterable_warned}


def fp16_phase(rank: int) -> dict:
    """An overflow on the last rank only: synchronised gradients carry it, every rank skips the update."""
    acc = fresh(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=16.0)])
    model = linear()
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = weights(model.module)
    loss = loss_of(model, rank, 0)
    acc.backward(loss * float("inf") if rank == acc.num_processes - 1 else loss)
    optimizer.step()
    return {"skipped": acc.optimizer_step_was_skipped, "unchanged": weights(model.module) == before}


def scheduler_phase(split_batches: bool) -> float:
    acc = fresh(dataloader_config=DataLoaderConfiguration(split_batches=split_batches))
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    optimizer.step()
    scheduler.step()
    return scheduler.get_last_lr()[0]


def free_memory_phase() -> list[bool]:
    acc = fresh()
    model = linear()
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.backward(loss_of(model, 0, 0))
    alive = [weakref.ref(model), weakref.ref(optimizer)]
    acc.free_memory()
    del model, optimizer
    gc.collect()
    return [ref() is not None for ref in alive]


def training_checks() -> dict:
    rank, size = int(__import__("os").environ["RANK"]), int(__import__("os").environ["WORLD_SIZE"])
    return {
        "ddp": ddp_phase(rank),
        "sync": sync_phase(rank),
        "each_batch": sync_each_batch_phase(rank),
        "join": join_phase(rank, size),
        "fp16": fp16_phase(rank),
        "schedule": [scheduler_phase(False), scheduler_phase(True)],
        "kept": free_memory_phase(),
    }


def mean(columns: list[list[float]]) -> list[float]:
    return [sum(values) / len(values) for values in zip(*columns)]


def close(a: list[float], b: list[float]) -> bool:
    return torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("size, machines", [(2, 1), (4, 2)], ids=["2", "2x2"])
def test_training_across_ranks(size, machines):
    reports = simulators.run(training_checks, world=size, machines=machines, timeout=240)
    for rank, r in enumerate(reports):
        ddp = r["ddp"]
        assert ddp["wrapped"] == "DistributedDataParallel" and ddp["unwrapped_is_linear"], ddp
        assert ddp["find_unused"] is True and ddp["bucket_bytes"] == 1024 * 1024, "DDP kwargs reach the wrapper"
        assert "device_map='auto'" in ddp["refused"], "a device-mapped model is refused at several processes (HF's words)"

        sync = r["sync"]
        assert sync["sync"] == [False, True]
        assert close(sync["accumulate"][0], sync["local_first"]), f"rank {rank}: first micro-step stays local"
        assert close(sync["after_first"], sync["local_first"]), f"rank {rank}: backward after no_sync forwards is local"
        triggered = mean([x["sync"]["local_sum"] for x in reports])
        assert close(sync["after_trigger"], triggered), f"rank {rank}: triggered sync"

        join = r["join"]
        assert join["batches"] == (3 if rank == 0 else 2), "uneven batches in join_uneven_inputs(even_batches=False)"
        assert join["after"] == 3, "even_batches restored after the block"
        assert join["iterable_warned"], "overriding even_batches with an iterable loader prepared warns in HF's words"
        assert close(join["weights"], reports[0]["join"]["weights"]), f"rank {rank}: weights agree after joining"

        assert r["fp16"] == {"skipped": True, "unchanged": True}, f"rank {rank}: overflow on one rank skips everywhere"
        assert r["schedule"] == [0.5**size, 0.5], "one update: num_processes scheduler steps, one with split_batches"
        assert r["kept"] == [False, False], f"rank {rank}: free_memory must drop the prepared DDP model and optimizer"

    each_batch = mean([r["each_batch"] for r in reports])
    assert all(close(r["each_batch"], each_batch) for r in reports), "sync_each_batch: first micro-step synchronised"
    assert not close(reports[0]["each_batch"], reports[0]["sync"]["local_first"]), "and not local"
    accumulated = mean([r["sync"]["accumulate"][1] for r in reports])
    assert all(close(r["sync"]["accumulate"][1], accumulated) for r in reports), "second micro-step synchronised"
    gathered = [item for step in reports[0]["join"]["gathered"] for item in step]
    assert sorted(gathered) == list(range(2 * size + 1)), "gather_for_metrics drops the even_batches duplicates"
