"""A dry run's split of a peak names the activations, the storages autograd holds for backward
(``simulators.devices.memory.activations``), apart from the rest.

The arithmetic, for ``Linear(D, H) -> ReLU -> Linear(H, D)`` without biases on a batch of B fp32 rows, at a peak
taken after the forward and before the backward: the first linear saves its input (B x D), ReLU saves its output
(B x H), which the second linear saves too (one storage); the weights are saved as themselves and stay parameters;
the first linear's output and the model's output are not saved. Under ``torch.utils.checkpoint`` only the
checkpoint's input is kept; under ``torch.no_grad()`` nothing is.
"""
from __future__ import annotations

import json
import textwrap

from simulators.fork_root import run_module

B, D, H = 64, 256, 4096
#: Rank 0 keeps the graph, rank 1 checkpoints the model (and takes a ``torch.func`` gradient, which refuses to run
#: under saved-tensor hooks), rank 2 runs without grad; each then allocates 64 MiB, its peak, before any backward.
SCRIPT = textwrap.dedent(f"""\
    import os
    import torch
    from torch.utils.checkpoint import checkpoint

    rank = int(os.environ["RANK"])
    model = torch.nn.Sequential(torch.nn.Linear({D}, {H}, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear({H}, {D}, bias=False)).cuda()
    x = torch.randn({B}, {D}, device="cuda", requires_grad=rank == 1)
    if rank == 0:
        y = model(x)
    elif rank == 1:
        y = checkpoint(model, x, use_reentrant=False)
        torch.func.grad(lambda v: torch.sigmoid(v).sum())(torch.randn(3, device="cuda"))
    else:
        with torch.no_grad():
            y = model(x)
    peak = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    del peak
    if y.requires_grad:
        y.sum().backward()
    """)


def test_activations_are_what_autograd_saves_checkpointed_or_not(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    done = run_module("accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda", "--num_processes",
                      "3", "--gpu", "a100-40gb", "--summary-json", "summary.json", "--timeout", "240", "train.py", timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = json.loads((tmp_path / "summary.json").read_text())["ranks"]
    parts = [next(iter(rank["memory"].values()))["parts"] for rank in ranks]
    expected = [4 * (B * D + B * H), 4 * B * D, 0]
    assert [part["activations"] for part in parts] == expected, parts
    assert all(part["trainable_parameters"] == 4 * 2 * D * H for part in parts), parts
    assert "activations 1.06 MiB" in done.stdout and "activations 64.00 KiB" in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("activations") == 2, "a run without grad has none, and its line leaves the part out"
