"""Big-model inference side by side in one run: accelerate_ref against HF accelerate.

(a) Loading: a generated sharded safetensors checkpoint (``--size-mb``,
    about 2 GB by default, one shard per layer) goes into a model built
    under ``init_empty_weights`` with ``load_checkpoint_and_dispatch(...,
    device_map="auto", max_memory={"cpu": --cpu-budget-mb})``, which sends
    most layers to disk. Each implementation runs in a fresh process, so its
    peak RSS is its own: wall time, peak RSS growth over the process's start,
    and the goal bound (1.3 x (largest layer + CPU budget)).
(b) Hook overhead: a small model dispatched with hooks on the CPU
    (``force_hooks=True``) by each implementation, against the same model
    called plainly, all three in one process taking turns: the fastest
    round's time per forward, as ratios.

Prints one line per measurement and the ratios (goals: accelerate_ref no
slower than HF, peak RSS below the bound).

    python benchmarks/big_model.py [--size-mb 2000] [--layers 16] [--cpu-budget-mb 256] [--forwards 200]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file
from torch import nn

IMPLEMENTATIONS = ("accelerate_ref", "accelerate")


class Layer(nn.Module):
    """One square Linear: the unit kept whole (``no_split_module_classes=["Layer"]``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Stack(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def width_for(size_mb: int, layers: int) -> int:
    """The width whose ``layers`` float32 square layers take about ``size_mb`` MB."""
    return int((size_mb * 10**6 / layers / 4) ** 0.5)


def write_checkpoint(folder: str, width: int, layers: int) -> None:
    """One shard per layer, generated one at a time (the checkpoint is never whole in RAM here either)."""
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    for index in range(layers):
        name = f"model-{index + 1:05d}-of-{layers:05d}.safetensors"
        shard = {
            f"layers.{index}.linear.weight": torch.randn(width, width, generator=generator) / width**0.5,
            f"layers.{index}.linear.bias": torch.zeros(width),
        }
        save_file(shard, os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        del shard
    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as stream:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, stream)


def measure_loading(impl_name: str, folder: str, width: int, layers: int, cpu_budget: int) -> dict:
    """In this (fresh) process: load and dispatch, then one forward; wall time and peak RSS growth."""
    import psutil

    impl = importlib.import_module(impl_name)
    start_rss = psutil.Process().memory_info().rss  # now, not the peak of the imports
    offload = tempfile.mkdtemp(prefix="big-model-offload-")
    try:
        started = time.perf_counter()
        with impl.init_empty_weights():
            model = Stack(width, layers)
        model = impl.load_checkpoint_and_dispatch(
            model, folder, device_map="auto", max_memory={"cpu": cpu_budget}, no_split_module_classes=["Layer"],
            offload_folder=offload,
        )
        loaded = time.perf_counter() - started
        with torch.no_grad():
            model(torch.ones(1, width))
        total = time.perf_counter() - started
    finally:
        shutil.rmtree(offload, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    disk = sum(1 for device in model.hf_device_map.values() if device == "disk")
    return {"load_s": loaded, "load_and_forward_s": total, "peak_growth": peak - start_rss, "disk_entries": disk}


def hooked_models(width: int = 64, depth: int = 8) -> dict[str, nn.Module]:
    """The same small model called plainly, and dispatched with hooks on the CPU by each implementation."""
    torch.manual_seed(0)
    plain = Stack(width, depth).eval()
    models = {"plain": plain}
    device_map = {f"layers.{i}": "cpu" for i in range(depth)}
    for name in IMPLEMENTATIONS:
        hooked = Stack(width, depth).eval()
        hooked.load_state_dict(plain.state_dict())
        importlib.import_module(name).dispatch_model(hooked, device_map, force_hooks=True)
        models[name] = hooked
    return models


def measure_hooks(forwards: int, rounds: int = 7) -> dict[str, float]:
    """Seconds per forward of each model of `hooked_models`, side by side in this process.

    The models take turns for ``rounds`` rounds of ``forwards`` calls each,
    and each keeps its fastest round, so a burst of load on a shared machine
    lands on one round of one model, not on one implementation's whole run.
    """
    models = hooked_models()
    x = torch.randn(4, 64)
    best = dict.fromkeys(models, float("inf"))
    with torch.no_grad():
        for model in models.values():
            for _ in range(10):
                model(x)
        for _ in range(rounds):
            for label, model in models.items():
                started = time.perf_counter()
                for _ in range(forwards):
                    model(x)
                best[label] = min(best[label], (time.perf_counter() - started) / forwards)
    return best


def child(args: argparse.Namespace) -> None:
    print(json.dumps(measure_loading(args.child, args.folder, args.width, args.layers, args.cpu_budget_mb * 10**6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2000, help="checkpoint size in MB (default 2000)")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--cpu-budget-mb", type=int, default=256)
    parser.add_argument("--forwards", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        child(args)
        return
    width = width_for(args.size_mb, args.layers)
    layer_bytes = (width * width + width) * 4
    folder = tempfile.mkdtemp(prefix="big-model-checkpoint-")
    results = {}
    try:
        write_checkpoint(folder, width, args.layers)
        print(f"checkpoint: {args.layers} layers of {width}x{width} float32, {args.layers * layer_bytes / 1e6:.0f} MB; CPU budget {args.cpu_budget_mb} MB")
        for name in IMPLEMENTATIONS:
            command = [
                sys.executable, __file__, "--child", name, "--folder", folder, "--width", str(width), "--layers", str(args.layers),
                "--cpu-budget-mb", str(args.cpu_budget_mb), "--forwards", str(args.forwards),
            ]
            run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            if run.returncode != 0:
                raise SystemExit(f"big_model: the {name} run failed: {run.stderr.strip().splitlines()[-1:]}")
            results[name] = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    bound = 1.3 * (layer_bytes + args.cpu_budget_mb * 10**6)
    for name, result in results.items():
        print(
            f"{name:15s} load {result['load_s']:.2f} s, load+forward {result['load_and_forward_s']:.2f} s, "
            f"peak RSS growth {result['peak_growth'] / 1e6:.0f} MB (bound {bound / 1e6:.0f} MB: "
            f"{'met' if result['peak_growth'] < bound else 'MISSED'}), {result['disk_entries']} disk entries"
        )
    ref, hf = results["accelerate_ref"], results["accelerate"]
    print(f"ratio load time accelerate_ref / accelerate: {ref['load_and_forward_s'] / hf['load_and_forward_s']:.2f} (goal <= 1.0)")
    print(f"ratio peak RSS accelerate_ref / accelerate: {ref['peak_growth'] / max(hf['peak_growth'], 1):.2f}")
    forward = measure_hooks(args.forwards)
    for label, seconds in forward.items():
        print(f"forward {label:15s} {seconds * 1e6:.0f} us (x{seconds / forward['plain']:.2f} of plain)")
    print(f"ratio hooked forward accelerate_ref / accelerate: {forward['accelerate_ref'] / forward['accelerate']:.2f} (goal <= 1.0)")


if __name__ == "__main__":
    main()
