"""``accelerate-ref launch --simulate cuda --heaviest_batches K``: the batch that decides the peak, found without running
every step (:mod:`simulators.devices.memory.batches`)."""

from __future__ import annotations

import json
import textwrap

import torch

from accelerate_ref.commands.accelerate_cli import run
from simulators.devices.memory.batches import order, size

#: 64 one-row batches of 16 tokens but one of 2,048 at position 40, as a padded language-model loader makes them.
LATE_ROW = textwrap.dedent("""\
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    rows = [torch.zeros(16, dtype=torch.long) for _ in range(64)]
    rows[40] = torch.zeros(2048, dtype=torch.long)
    loader = torch.utils.data.DataLoader(rows, batch_size=1)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 256), torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 100))
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        accelerator.backward(model(batch).float().pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    """)


def test_the_first_batch_then_the_heaviest_largest_first_then_the_rest_in_order():
    batches = [torch.zeros(4), torch.zeros(2), torch.zeros(9), {"ids": torch.zeros(3, 3), "mask": torch.zeros(3, 3)},
               (torch.zeros(9),)]
    assert [size(batch) for batch in batches] == [4, 2, 9, 18, 9]
    assert order(batches, 2) == [0, 3, 2, 1, 4], "the first, then the 2 largest (the earlier of equals), then the rest"
    assert order(batches, 10) == [0, 3, 2, 4, 1]
    assert order(batches[:1], 3) == [0]


def _dry_run(tmp_path, capsys, *flags: str) -> tuple[str, dict]:
    script = tmp_path / "train.py"
    script.write_text(LATE_ROW)
    status = run(["launch", "--simulate", "cuda", "--gpu", "a100-40gb", "--num_processes", "1", *flags,
                  "--summary-json", str(tmp_path / "summary.json"), str(script)])
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    rank = json.loads((tmp_path / "summary.json").read_text())["ranks"][0]
    return out, rank["memory"]["cuda:0"]


def test_a_two_step_dry_run_with_the_heaviest_batch_reports_the_peak_of_the_whole_epoch(tmp_path, capsys):
    whole, whole_books = _dry_run(tmp_path, capsys)
    assert "the 64 batches it ran differ in size (16 to 2,048 elements)" in whole, whole[-2000:]
    assert whole_books["step"] == 41, "the whole epoch peaks at the long row (position 40), with the optimizer's state"

    first_two, first_two_books = _dry_run(tmp_path, capsys, "--steps", "2")
    assert first_two_books["peak"] < whole_books["peak"], "two steps in data order miss the long row"

    heaviest, heaviest_books = _dry_run(tmp_path, capsys, "--steps", "2", "--heaviest_batches", "1")
    assert "of 64 batches read, ran the first, then the heaviest: #40 (2,048 elements)" in heaviest, heaviest[-2000:]
    assert (heaviest_books["peak"], heaviest_books["reserved"]) == (whole_books["peak"], whole_books["reserved"]), (
        f"two steps with the heaviest batch: {heaviest_books}; the whole epoch: {whole_books}")
