"""The four models of the preflight accuracy check (issue 22, item 4): one AdamW training step of each, then the
peak device memory as torch reports it.

Run plainly on a GPU (``python benchmarks/preflight_models.py mlp``) it prints
``torch.cuda.max_memory_allocated()`` (on a machine without a GPU it trains on the CPU and the peak is null:
``benchmarks/dry_run_cost.py`` times it so); with ``--memtracker``, the peak of torch's own tracker
(``torch.distributed._tools.mem_tracker.MemTracker``, the second step's) on the GPU if there is one (a mock
GPU in a dry run), else on the CPU; dry-run on mock GPUs
(``accelerate-ref launch --simulate cuda --summary-json out.json benchmarks/preflight_models.py mlp``) the
summary gives the peak the simulator predicts for the same step. The models: an MLP, a convolutional net, a
small GPT-2 built from a ``transformers`` config (eager attention, as the CPU computes it), the same
size of transformer from torch's own layers (``encoder``), and an embedding-heavy model.

With ``--distributed ddp`` or ``fsdp2`` the model is wrapped in torch's DDP or sharded with torch's FSDP2
(``fully_shard`` on each transformer block, or each child with parameters, then the root) over the ranks a launcher started (gloo on the CPU,
nccl on GPUs); each rank prints its own peak. Under MemTracker the wrapping happens inside the tracker, so the
buffers DDP and FSDP2 allocate count as they do on a device. The tracker does not see what gloo (the CPU's
backend, and the mock GPUs' stand-in for NCCL) allocates inside a collective, its reduce-scatter working on copies
of the whole input: NCCL's buffers do not come from torch's allocator, so ``torch.cuda.max_memory_allocated()``
never counts them either.

    python benchmarks/preflight_models.py {mlp,conv,transformer,encoder,embedding} [--batch 16] [--distributed ddp]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Callable

import torch
from torch import nn


def build(name: str, batch: int) -> tuple[nn.Module, Callable[[nn.Module, torch.device], torch.Tensor]]:
    """The model ``name`` and a function computing its loss on a batch on a device."""
    if name == "mlp":
        model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048))
        return model, lambda m, device: m(torch.randn(batch, 2048, device=device)).pow(2).mean()
    if name == "conv":
        model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
        return model, lambda m, device: m(torch.randn(batch, 3, 64, 64, device=device)).pow(2).mean()
    if name == "transformer":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8000, n_positions=256)
        config._attn_implementation = "eager"
        model = GPT2LMHeadModel(config)

        def loss(m: nn.Module, device: torch.device) -> torch.Tensor:
            tokens = torch.randint(0, 8000, (batch, 128), device=device)
            return m(input_ids=tokens, labels=tokens).loss

        return model, loss
    if name == "encoder":
        layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
        model = nn.Sequential(nn.Embedding(8000, 512), nn.TransformerEncoder(layer, num_layers=4), nn.Linear(512, 8000))
        return model, lambda m, device: m(torch.randint(0, 8000, (batch, 128), device=device)).float().logsumexp(-1).mean()
    if name == "embedding":
        model = nn.Sequential(nn.EmbeddingBag(500_000, 128), nn.Linear(128, 1))
        return model, lambda m, device: m(torch.randint(0, 500_000, (batch, 32), device=device)).pow(2).mean()
    raise SystemExit(f"unknown model {name!r}: mlp, conv, transformer, encoder or embedding")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["mlp", "conv", "transformer", "encoder", "embedding"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--memtracker", action="store_true", help="on the CPU, under torch's MemTracker")
    parser.add_argument("--distributed", choices=["none", "ddp", "fsdp2"], default="none")
    parser.add_argument("--replicate", type=int, default=1,
                        help="fsdp2: hybrid sharding, the ranks as this many replicas x (world / replicas) shards")
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 mixed precision: FSDP2's MixedPrecisionPolicy (bf16 parameters, fp32 reduction), else autocast")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model, loss_of = build(args.model, args.batch)
    parameters = sum(p.numel() for p in model.parameters())
    model = model.to(device)
    started = time.perf_counter()
    if args.memtracker:
        from torch.distributed._tools.mem_tracker import MemTracker

        _untracked_collectives()
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker:
            model = distribute(model, args.distributed, device, args.replicate, args.bf16)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            with _autocast(device, args):
                _steps(model, loss_of, optimizer, device, between=tracker.reset_mod_stats)
        peak = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    else:
        model = distribute(model, args.distributed, device, args.replicate, args.bf16)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with _autocast(device, args):
            _steps(model, loss_of, optimizer, device)
        peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    seconds = time.perf_counter() - started  # wrapping (DDP, FSDP2) and the two steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"model": args.model, "parameters": parameters, "peak": peak, "seconds": round(seconds, 3),
                      "max_rss_kib": rss}), flush=True)
    if args.distributed != "none":
        torch.distributed.destroy_process_group()
    return 0


def _autocast(device: torch.device, args: argparse.Namespace) -> torch.autocast:
    """bf16 autocast for ``--bf16`` without FSDP2 (whose MixedPrecisionPolicy casts instead), else a no-op."""
    return torch.autocast(device.type, torch.bfloat16, enabled=args.bf16 and args.distributed != "fsdp2")


def distribute(model: nn.Module, how: str, device: torch.device, replicas: int = 1, bf16: bool = False) -> nn.Module:
    """``model`` as torch's DDP or FSDP2 (``how``) over the launcher's ranks, or unchanged (``none``). FSDP2
    shards over a 2-D mesh of ``replicas`` x (world / ``replicas``) ranks when ``replicas`` > 1 (hybrid), and
    computes in bf16 with fp32 reductions when ``bf16``."""
    if how == "none":
        return model
    torch.distributed.init_process_group("gloo" if device.type == "cpu" else "nccl")
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=None if device.type == "cpu" else [device.index])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    world = torch.distributed.get_world_size()
    mesh = (init_device_mesh(device.type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard"))
            if replicas > 1 else init_device_mesh(device.type, (world,)))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for unit in _units(model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


#: The collectives DDP and FSDP2 call from Python (their outputs are allocated before the call, by the caller).
COLLECTIVES = ("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single",
               "all_reduce", "broadcast")


def _untracked_collectives() -> None:
    """Run the collectives with no dispatch mode active, so that MemTracker does not count the working copies
    gloo makes inside them (a GPU's NCCL takes none from torch's allocator)."""
    from torch.distributed import distributed_c10d
    from torch.utils._python_dispatch import _disable_current_modes

    def untracked(collective: Callable) -> Callable:
        def call(*args, **kwargs):
            with _disable_current_modes():
                return collective(*args, **kwargs)

        return call

    for name in COLLECTIVES:
        if hasattr(distributed_c10d, name):  # callers reach them through either module
            for module in (distributed_c10d, torch.distributed):
                setattr(module, name, untracked(getattr(distributed_c10d, name)))


def _units(model: nn.Module) -> list[nn.Module]:
    """What FSDP2 shards one by one before the root: a transformer's blocks (GPT-2's head shares the embedding's
    weight, so it stays with the root), else each child with parameters."""
    transformer = getattr(model, "transformer", None)
    if transformer is not None:
        return list(transformer.h)
    return [child for child in model.children() if any(True for _ in child.parameters())]


def _steps(model: nn.Module, loss_of: Callable, optimizer: torch.optim.Optimizer, device: torch.device,
           between: Callable[[], None] = lambda: None) -> None:
    """Two training steps (``between`` runs after the first: MemTracker counts one iteration's modules)."""
    for step in range(2):
        loss_of(model, device).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            between()


if __name__ == "__main__":
    sys.exit(main())
