"""The setup matrix of issue 22 item 1: one training script per setup, written for HF accelerate and switched to
accelerate_ref, dry-run on 2 mock GPUs (4 as 2 machines for hybrid sharding) until it ends well.

A setup a GPU would run but the mock cannot is a strict xfail naming torch's mechanism that refuses it (and a
limit in the README), never a silent pass. ``make extended`` runs the matrix (each run starts its ranks: about
10 s apiece); ``make test`` runs the FSDP2, resume, OOM and collective dry runs of ``test_dry_run.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.extended

SCRIPT = textwrap.dedent("""\
    import torch
    from {package} import Accelerator
    from {package}.parallelism_config import ParallelismConfig  # noqa: F401
    from {package}.utils import FullyShardedDataParallelPlugin, TorchDynamoPlugin  # noqa: F401

    accelerator = Accelerator({accelerator})
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(4):
        with accelerator.accumulate(model):
            loss = model(torch.randn(4, 8, device=accelerator.device)).float().pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    print("trained", accelerator.distributed_type, accelerator.mixed_precision, flush=True)
    """)

FSDP2 = "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2{})"
#: setup -> (Accelerator keyword arguments, ranks, machines)
SETUPS = {
    "ddp": ("", 2, 1),
    "ddp-bf16": ('mixed_precision="bf16"', 2, 1),
    "ddp-fp16": ('mixed_precision="fp16"', 2, 1),
    "ddp-accumulation": ("gradient_accumulation_steps=2", 2, 1),
    "ddp-compile": ('dynamo_plugin=TorchDynamoPlugin(backend="eager")', 2, 1),
    "fsdp2-full-shard": (FSDP2.format(""), 2, 1),
    "fsdp2-shard-grad-op": (FSDP2.format(", reshard_after_forward=False"), 2, 1),
    "fsdp2-bf16": (FSDP2.format("") + ', mixed_precision="bf16"', 2, 1),
    "fsdp2-cpu-offload": (FSDP2.format(", cpu_offload=True"), 2, 1),
    "fsdp2-hybrid-2-machines": (FSDP2.format("") + ", parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)", 4, 2),
    # HF 1.15 checkpoints the layers its wrap policy picks, and fails without one (on a GPU too).
    "fsdp2-activation-checkpointing": (FSDP2.format(', activation_checkpointing=True, auto_wrap_policy="size_based_wrap", '
                                                    "min_num_params=64"), 2, 1),
}
#: Setups a GPU runs and the mock cannot, with torch's mechanism that refuses them (README, "Limits").
LIMITS = {
    "ddp-compile": "torch.compile traces with fake tensors on the meta device; dynamo then sets a mock tensor's "
                   "storage to a meta storage, which torch refuses ('the devices must match')",
}


@pytest.mark.parametrize("package", ["accelerate", "accelerate_ref"])
@pytest.mark.parametrize("setup", [pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=LIMITS[name])] if name in LIMITS else [])
                                   for name in SETUPS])
def test_setup_dry_runs_on_mock_gpus(tmp_path, setup, package):
    accelerator, ranks, machines = SETUPS[setup]
    (tmp_path / "train.py").write_text(SCRIPT.format(package=package, accelerator=accelerator))
    done = subprocess.run(
        [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
         "--num_processes", str(ranks), "--num_machines", str(machines), "--timeout", "240", "train.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ},
    )
    assert done.returncode == 0, f"{setup} ({package}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    for rank in range(ranks):
        assert f"[rank {rank}] trained" in done.stdout, done.stdout[-3000:]
    assert "-- memory per rank" in done.stdout
