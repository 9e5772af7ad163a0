"""Issue 23: ``--steps`` ends an endless training loop; item 2: a dry run without computing (``launch --simulate cuda --no-compute``) reports the same peaks as
one that computes, within 2%, for DDP, FSDP2 full shard and hybrid, and bf16 mixed precision, at 2 and 4 ranks.

Each run starts its ranks twice (about 20 s), so the whole grid runs under ``make extended``;
``tests/simulators/devices/test_no_compute.py`` checks the books of DDP and FSDP2 steps in ``make test``.
"""

from __future__ import annotations

import json
import os

import pytest

from simulators.fork_root import run_module
from accelerate_ref.commands.accelerate_cli import run

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks", "preflight_models.py")

#: name -> (ranks, preflight_models.py arguments)
SETUPS = {
    "ddp-2": (2, ["--distributed", "ddp"]),
    "ddp-4": (4, ["--distributed", "ddp"]),
    "ddp-bf16-autocast-2": (2, ["--distributed", "ddp", "--bf16"]),
    "fsdp2-full-shard-2": (2, ["--distributed", "fsdp2"]),
    "fsdp2-full-shard-4": (4, ["--distributed", "fsdp2"]),
    "fsdp2-hybrid-2x2": (4, ["--distributed", "fsdp2", "--replicate", "2"]),
    "fsdp2-bf16-2": (2, ["--distributed", "fsdp2", "--bf16"]),
    "fsdp2-bf16-4": (4, ["--distributed", "fsdp2", "--bf16"]),
}


def _peaks(tmp_path, ranks: int, arguments: list[str], no_compute: bool) -> list[int]:
    """Every rank's peak in a dry run of ``preflight_models.py transformer arguments``."""
    summary = tmp_path / f"summary-{no_compute}.json"
    done = run_module("accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                      *(["--no-compute"] if no_compute else []), "--num_processes", str(ranks), "--timeout", "300",
                      "--summary-json", str(summary), MODELS, "transformer", "--batch", "4", *arguments, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    found = json.loads(summary.read_text())
    return [max(device["peak"] for device in rank["memory"].values()) for rank in found["ranks"]]


@pytest.mark.extended
@pytest.mark.parametrize("name", list(SETUPS))
def test_no_compute_peaks_equal_the_computed_ones_within_2_percent(tmp_path, name):
    ranks, arguments = SETUPS[name]
    computed, estimated = (_peaks(tmp_path, ranks, arguments, no_compute) for no_compute in (False, True))
    for rank, (real, dry) in enumerate(zip(computed, estimated)):
        assert abs(dry / real - 1) <= 0.02, f"{name}, rank {rank}: no-compute peak {dry:,}, computed {real:,} ({dry / real:.4f})"


ENDLESS = """\
import torch
model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while model(torch.randn(2, 4, device="cuda")).sum().item() < 1e9:  # a placeholder 0 without compute: never ends
    model(torch.randn(2, 4, device="cuda")).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    print("step", step, flush=True)
"""


def test_steps_end_an_endless_loop_without_compute_after_that_many_optimizer_steps(tmp_path, monkeypatch, capsys):
    (tmp_path / "train.py").write_text(ENDLESS)
    monkeypatch.chdir(tmp_path)
    assert run(["launch", "--simulate", "cuda", "--no-compute", "--steps", "3", "--num_processes", "2", "--timeout", "120",
                "train.py"]) == 0
    output = capsys.readouterr().out
    assert "[rank 1] step 2" in output and "step 3" not in output, output[-2000:]  # the hook ends the rank inside step 3
    assert "rank 0: exit 0" in output and "train.py:5: item on every rank" in output, output[-2000:]
