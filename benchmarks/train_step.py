"""One small training loop three ways, side by side in one run: accelerate_ref, HF accelerate, hand-written DDP.

Each rank of one simulated world (2 ranks by default) runs, in rounds, the
same work with each variant: prepare (or wrap by hand) a small MLP, its SGD
optimizer and two loaders, train ``--steps`` micro-batches with gradient
accumulation, then evaluate the whole evaluation set, gathering predictions
and targets for the metric without the duplicates of the padded last batch.

* ``accelerate_ref`` and ``accelerate``: ``prepare``, ``accumulate(model)``,
  ``backward``, ``gather_for_metrics``;
* ``manual``: torch.distributed by hand: ``DistributedDataParallel``,
  ``DistributedSampler``, ``no_sync`` on accumulating steps, the loss divided
  by the accumulation steps, ``all_gather`` and trimming the padding.

Prints micro-steps per second of each variant (the best round, slowest rank)
and the ratios (goals: accelerate_ref at least as fast as HF accelerate, and
within 10% of the hand-written loop).

    python benchmarks/train_step.py [--world 2] [--steps 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import time
from typing import Any, Callable

import torch

import simulators

ACCUMULATION = 2
BATCH = 16
FEATURES = 32
EVAL_SAMPLES = 1001  # not a multiple of the global batch: the last batch is padded


def build(samples: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    """The model, optimizer and plain loaders every variant starts from (same seed everywhere)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples + EVAL_SAMPLES, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    train = torch.utils.data.TensorDataset(x[:samples], y[:samples])
    evaluation = torch.utils.data.TensorDataset(x[samples:], y[samples:])
    return model, optimizer, train, evaluation


def with_accelerate(name: str, samples: int) -> tuple[float, float]:
    """The documented loop with the implementation ``name``; returns (seconds, evaluation MSE)."""
    module = importlib.import_module(name)
    model, optimizer, train, evaluation = build(samples)
    started = time.perf_counter()
    acc = module.Accelerator(gradient_accumulation_steps=ACCUMULATION)
    model, optimizer, train_loader, eval_loader = acc.prepare(
        model,
        optimizer,
        torch.utils.data.DataLoader(train, batch_size=BATCH),
        torch.utils.data.DataLoader(evaluation, batch_size=BATCH),
    )
    for x, y in train_loader:
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    squared, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_loader:
            predictions, targets = acc.gather_for_metrics((model(x), y))
            squared += float(((predictions - targets) ** 2).sum())
            count += len(targets)
    elapsed = time.perf_counter() - started
    module.state.AcceleratorState._reset_state(True)
    module.state.GradientState._reset_state()
    assert count == EVAL_SAMPLES, f"{name}: evaluated {count} samples, expected {EVAL_SAMPLES}"
    return elapsed, squared / count


def by_hand(samples: int) -> tuple[float, float]:
    """The same loop written against torch.distributed directly."""
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    model, optimizer, train, evaluation = build(samples)
    started = time.perf_counter()
    world = dist.get_world_size()
    model = torch.nn.parallel.DistributedDataParallel(model)
    train_loader = torch.utils.data.DataLoader(train, batch_size=BATCH, sampler=DistributedSampler(train, shuffle=False))
    eval_loader = torch.utils.data.DataLoader(
        evaluation, batch_size=BATCH, sampler=DistributedSampler(evaluation, shuffle=False)
    )
    for step, (x, y) in enumerate(train_loader, start=1):
        syncing = step % ACCUMULATION == 0 or step == len(train_loader)
        context = model.no_sync() if not syncing else contextlib.nullcontext()
        with context:
            (torch.nn.functional.mse_loss(model(x), y) / ACCUMULATION).backward()
        if syncing:
            optimizer.step()
            optimizer.zero_grad()
    squared, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_loader:
            local = torch.cat([model(x), y], dim=1)
            gathered = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(gathered, local)
            both = torch.cat(gathered)[: EVAL_SAMPLES - count]  # the sampler pads the last batch
            squared += float(((both[:, 0] - both[:, 1]) ** 2).sum())
            count += len(both)
    elapsed = time.perf_counter() - started
    assert count == EVAL_SAMPLES, f"manual: evaluated {count} samples, expected {EVAL_SAMPLES}"
    return elapsed, squared / count


VARIANTS: dict[str, Callable[[int], tuple[float, float]]] = {
    "accelerate_ref": lambda samples: with_accelerate("accelerate_ref", samples),
    "accelerate": lambda samples: with_accelerate("accelerate", samples),
    "manual": by_hand,
}


def rank_main(steps: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """On every rank: warm up (torch builds DDP with torch._dynamo, seconds the first time), then time the rounds."""
    import torch.distributed as dist

    importlib.import_module("accelerate_ref").Accelerator()  # joins the process group every variant then reuses
    importlib.import_module("accelerate_ref").state.AcceleratorState._reset_state(True)
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    samples = steps * BATCH * dist.get_world_size()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, variant in VARIANTS.items():
            dist.barrier()
            times[name].append(variant(samples))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="micro-batches per rank per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    torch_threads = {"OMP_NUM_THREADS": "1"}  # ranks share the cores; no oversubscription
    # HF accelerate sees MULTI_CPU under a torchrun-style launch only with ACCELERATE_USE_CPU.
    reports = simulators.run(
        rank_main, world=args.world, args=(args.steps, args.rounds), timeout=1800,
        env={"ACCELERATE_USE_CPU": "1", **torch_threads},
    )
    print(f"train_step: world={args.world} steps={args.steps} (accumulation {ACCUMULATION}, batch {BATCH}/rank, "
          f"eval {EVAL_SAMPLES} samples) rounds={args.rounds} torch={torch.__version__}")
    best: dict[str, float] = {}
    for name in VARIANTS:
        slowest_rank = [max(report[name][i][0] for report in reports) for i in range(args.rounds)]
        best[name] = args.steps / min(slowest_rank)
        metric = reports[0][name][0][1]
        rounds = ", ".join(f"{args.steps / t:.0f}" for t in slowest_rank)
        print(f"  {name:<15} {best[name]:8.1f} steps/s   (rounds: {rounds}; eval MSE {metric:.4f})")
    print(f"  accelerate_ref / accelerate : {best['accelerate_ref'] / best['accelerate']:.3f}  (goal >= 1.0)")
    print(f"  accelerate_ref / manual     : {best['accelerate_ref'] / best['manual']:.3f}  (goal >= 0.90)")
    print(f"  accelerate     / manual     : {best['accelerate'] / best['manual']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
