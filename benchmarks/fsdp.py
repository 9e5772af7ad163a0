"""DDP against FSDP full-shard, accelerate_ref against HF accelerate (and torch's bare ``fully_shard``), side by side.

Each variant runs in a fresh simulated world (2 and 4 ranks by default), so
the peak memory of a rank is its own: every rank builds the same MLP,
prepares it and an SGD optimizer with momentum (``fsdp``: with
``FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD")``), and
times ``--steps`` training steps after two warm-up steps. Printed per
variant: the median step time (of the slowest rank), the parameter bytes one
rank holds, and the peak RSS growth of a rank over its size once the
process group was up (model, gradients, optimizer state, communication
buffers). Then the ratios, with the goals of issue 12: FSDP parameter bytes
per rank at most 1/N + 10% of DDP's; accelerate_ref's step time within 1.1x
of HF's.

HF accelerate on MULTI_CPU drops the FSDP plugin and trains with DDP (see
the manifest), so its "fsdp" row is DDP and cannot be the reference for
FSDP step time; the ``torch/fsdp`` row (``fully_shard`` on the root module,
a plain optimizer, ``loss.backward()``: what accelerate_ref's default plugin
does, without the Accelerator) is the reference for that ratio instead.

    python benchmarks/fsdp.py [--worlds 2,4] [--steps 20] [--width 2048]

Timings on a shared machine are upper bounds.
"""

from __future__ import annotations

import argparse
import importlib
import resource
import statistics
import sys
import time
from typing import Any

import torch

import simulators

VARIANTS = [("accelerate_ref", "ddp"), ("accelerate", "ddp"), ("accelerate_ref", "fsdp"), ("accelerate", "fsdp"), ("torch", "fsdp")]


def _mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _local_bytes(model: torch.nn.Module) -> int:
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size() for p in model.parameters())


def _prepared(impl_name: str, mode: str, width: int) -> tuple[Any, Any, Any]:
    """(model, optimizer, backward) of a variant, ready to train."""
    if impl_name == "torch":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        model = fully_shard(_mlp(width), mesh=mesh)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), torch.Tensor.backward
    impl = importlib.import_module(impl_name)
    plugin = impl.FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD") if mode == "fsdp" else None
    acc = impl.Accelerator(fsdp_plugin=plugin) if plugin else impl.Accelerator()
    model = acc.prepare(_mlp(width))
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    return model, optimizer, acc.backward


def run_variant(impl_name: str, mode: str, steps: int, width: int) -> dict[str, Any]:
    """On one rank of a fresh world: step times, parameter bytes held, peak RSS growth."""
    import psutil

    importlib.import_module("accelerate_ref").PartialState()  # joins the process group (gloo)
    if impl_name != "torch":
        importlib.import_module(impl_name)
    torch.distributed.barrier()
    start_rss = psutil.Process().memory_info().rss
    model, optimizer, backward = _prepared(impl_name, mode, width)
    x, y = torch.randn(16, width), torch.randn(16, width)
    times = []
    for _ in range(steps + 2):  # two warm-up steps
        torch.distributed.barrier()
        start = time.perf_counter()
        backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"times": times[2:], "params": _local_bytes(model), "peak": max(peak - start_rss, 0)}


def _report(world: int, steps: int, width: int) -> None:
    step, params, peak = {}, {}, {}
    for impl_name, mode in VARIANTS:
        key = f"{impl_name}/{mode}"
        reports = simulators.run(
            run_variant, world=world, args=(impl_name, mode, steps, width), timeout=900,
            env={"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"},
        )
        step[key] = statistics.median(max(r["times"][i] for r in reports) for i in range(steps))
        params[key] = max(r["params"] for r in reports)
        peak[key] = max(r["peak"] for r in reports)
    print(f"fsdp: world={world} steps={steps} MLP 4x{width} ({params['accelerate_ref/ddp'] / 2**20:.1f} MiB of parameters) "
          f"torch={torch.__version__}")
    for key in step:
        note = "  (HF drops the plugin on MULTI_CPU: DDP)" if key == "accelerate/fsdp" else ""
        print(f"  {key:<20} {step[key] * 1e3:8.2f} ms/step   params/rank {params[key] / 2**20:7.2f} MiB   "
              f"peak RSS growth/rank {peak[key] / 2**20:7.1f} MiB{note}")
    print(f"  accelerate_ref fsdp/ddp params per rank   : {params['accelerate_ref/fsdp'] / params['accelerate_ref/ddp']:.3f}"
          f"  (goal <= {1 / world * 1.1:.3f})")
    print(f"  accelerate     fsdp/ddp params per rank   : {params['accelerate/fsdp'] / params['accelerate/ddp']:.3f}")
    print(f"  accelerate_ref fsdp/ddp peak RSS per rank : {peak['accelerate_ref/fsdp'] / max(peak['accelerate_ref/ddp'], 1):.3f}")
    print(f"  ddp step time accelerate_ref / accelerate : {step['accelerate_ref/ddp'] / step['accelerate/ddp']:.3f}  (goal <= 1.1)")
    print(f"  fsdp step time accelerate_ref / torch     : {step['accelerate_ref/fsdp'] / step['torch/fsdp']:.3f}  (goal <= 1.1)")
    print(f"  step time accelerate_ref fsdp / ddp       : {step['accelerate_ref/fsdp'] / step['accelerate_ref/ddp']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args(argv)
    for world in (int(w) for w in args.worlds.split(",")):
        _report(world, args.steps, args.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
