"""DDP against FSDP full-shard, accelerate_ref against HF accelerate, side by side in one run.

On every rank of a simulated world (2 and 4 ranks by default) each variant
prepares the same MLP and its SGD optimizer (``fsdp``: with
``FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD")``), then
times ``--steps`` training steps. Prints per variant the median step time
(slowest rank) and the parameter bytes one rank holds, and the ratios (goals:
FSDP parameter bytes per rank at most 1/N + 10% of DDP's; accelerate_ref's
step time within 1.1x of HF's). HF accelerate on MULTI_CPU drops the FSDP
plugin and trains with DDP (see the manifest), so its "fsdp" row is DDP.

    python benchmarks/fsdp.py [--worlds 2,4] [--steps 20] [--width 512]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from typing import Any

import torch

import simulators

VARIANTS = [(impl, mode) for impl in ("accelerate_ref", "accelerate") for mode in ("ddp", "fsdp")]


def _mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _local_bytes(model: torch.nn.Module) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in model.parameters())


def run_variant(impl_name: str, mode: str, steps: int, width: int) -> tuple[list[float], int]:
    """Step times and parameter bytes of this rank for one variant."""
    impl = importlib.import_module(impl_name)
    impl.state.AcceleratorState._reset_state(True)
    plugin = impl.FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD") if mode == "fsdp" else None
    acc = impl.Accelerator(fsdp_plugin=plugin) if plugin else impl.Accelerator()
    model = acc.prepare(_mlp(width))
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(16, width), torch.randn(16, width)
    times = []
    for _ in range(steps + 2):  # two warm-up steps
        start = time.perf_counter()
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return times[2:], _local_bytes(model)


def rank_main(steps: int, width: int) -> dict[str, Any]:
    import torch.distributed as dist

    importlib.import_module("accelerate_ref").Accelerator()  # joins the process group
    results = {}
    for impl_name, mode in VARIANTS:
        dist.barrier()
        results[f"{impl_name}/{mode}"] = run_variant(impl_name, mode, steps, width)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args(argv)
    for world in (int(w) for w in args.worlds.split(",")):
        reports = simulators.run(
            rank_main, world=world, args=(args.steps, args.width), timeout=900,
            env={"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"},
        )
        print(f"fsdp: world={world} steps={args.steps} MLP 4x{args.width} torch={torch.__version__}")
        step, memory = {}, {}
        for impl_name, mode in VARIANTS:
            key = f"{impl_name}/{mode}"
            per_step = [max(report[key][0][i] for report in reports) for i in range(args.steps)]
            step[key], memory[key] = statistics.median(per_step), max(report[key][1] for report in reports)
            print(f"  {key:<22} {step[key] * 1e3:8.2f} ms/step   params/rank {memory[key] / 2**20:7.2f} MiB")
        ref_share = memory["accelerate_ref/fsdp"] / memory["accelerate_ref/ddp"]
        print(f"  accelerate_ref fsdp/ddp params per rank : {ref_share:.3f}  (goal <= {1 / world * 1.1:.3f})")
        print(f"  accelerate     fsdp/ddp params per rank : {memory['accelerate/fsdp'] / memory['accelerate/ddp']:.3f}")
        for mode in ("ddp", "fsdp"):
            ratio = step[f"accelerate_ref/{mode}"] / step[f"accelerate/{mode}"]
            print(f"  {mode} step time accelerate_ref / accelerate : {ratio:.3f}  (goal <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
