"""`accelerate_ref.inference.prepare_pippy`: torch's pipelining on 2 simulated ranks (CPU, gloo).

Each rank prepares the same model; the checks hold for a model really cut
into one stage per rank whose pipelined output equals the un-split model's:
the stages' parameters partition the model's, the last rank alone gets the
output (every rank with ``gather_output=True``), and it equals the
un-split model's output on the same batch. `check_pipelined` is run on the
real implementation and, as a meta-test, on reports of a broken one that
does not split (it must reject those).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

import simulators
from accelerate_ref.inference import find_pippy_batch_size, generate_device_map, prepare_pippy


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).eval()


def _run(prepare: Callable[..., nn.Module], batch: torch.Tensor, **options: Any) -> dict:
    """One rank's report of a pipelined call: its stage's parameter count, its output, the expected output."""
    model = tiny_model()
    expected = model(batch)
    total = sum(p.numel() for p in model.parameters())
    micro_batch = batch[: -(-batch.shape[0] // 2)]  # one of the 2 chunks (padded to an even size)
    prepared = prepare(model, example_args=(micro_batch,), **options)
    stage = getattr(getattr(prepared, "pippy_stage", None), "_stage", None)
    held = total if stage is None else sum(p.numel() for p in stage.submod.parameters())
    with torch.no_grad():
        output = prepared(batch)
    return {"held": held, "total": total, "output": None if output is None else output.detach(), "expected": expected.detach()}


def _unsplit(model: nn.Module, **options: Any) -> nn.Module:
    """A broken `prepare_pippy`: the model runs whole on every rank."""
    return model


def pippy_on_every_rank(prepare_name: str) -> dict:
    from accelerate_ref import PartialState

    prepare = prepare_pippy if prepare_name == "real" else _unsplit
    PartialState()
    inputs = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))  # the same on every rank
    return {
        "plain": _run(prepare, inputs[:2], split_points=["2"]),  # named: stage 1 begins at the second Linear
        "gathered": _run(prepare, inputs[:2], gather_output=True),
        "padded": _run(prepare, inputs[2:], gather_output=True),  # 3 rows, 2 chunks: padded to 4
    }


def check_pipelined(reports: list[dict]) -> None:
    """The rules of the module docstring, over every rank's report (AssertionError when one is broken)."""
    last = len(reports) - 1
    for kind in ("plain", "gathered", "padded"):
        runs = [report[kind] for report in reports]
        assert sum(run["held"] for run in runs) == runs[0]["total"], f"{kind}: the stages do not partition the model"
        assert all(run["held"] < run["total"] for run in runs), f"{kind}: a rank holds the whole model"
        for rank, run in enumerate(runs):
            if kind == "plain" and rank != last:
                assert run["output"] is None, f"rank {rank} got an output without gather_output"
                continue
            rows = run["expected"].shape[0]
            assert run["output"] is not None, f"{kind}: rank {rank} got no output"
            torch.testing.assert_close(run["output"][:rows], run["expected"])
        if kind == "plain":
            assert [run["held"] for run in runs] == [40, runs[0]["total"] - 40], "split before submodule '2'"
        if kind == "padded":
            assert runs[last]["output"].shape[0] == 4, "3 rows in 2 chunks are padded to 4"


@pytest.mark.slow
def test_prepare_pippy_splits_and_matches_the_unsplit_model():
    reports = simulators.run(pippy_on_every_rank, world=2, args=("real",), timeout=240)
    check_pipelined(reports)


def test_prepare_pippy_on_one_process_leaves_the_model_whole():
    model = tiny_model()
    forward = model.forward
    batch = torch.ones(2, 4)
    assert prepare_pippy(model, example_args=(batch,)) is model and model.forward == forward
    assert model.pippy_stage is None and model.hf_split_points == []


def test_check_pipelined_rejects_a_model_that_is_not_split():
    """Meta-test: the reports of a `prepare_pippy` that does not split, as two ranks would give them."""
    reports = [pippy_on_every_rank("unsplit") for _ in range(2)]
    with pytest.raises(AssertionError, match="do not partition|whole model"):
        check_pipelined(reports)


def test_generate_device_map_balances_stages_and_keeps_no_split_modules_whole():
    model = nn.Sequential(nn.Linear(16, 64), nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)), nn.Linear(64, 2))
    assert generate_device_map(model, 2) == {"0": 0, "1.0": 0, "1.1": 1, "2": 1}
    assert generate_device_map(model, 2, no_split_module_classes=["Sequential"]) == {"0": 0, "1": 0, "2": 1}
    assert generate_device_map(nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]), 4) == {str(i): i for i in range(4)}
    with pytest.raises(ValueError, match="fewer than the 3 pipeline stages"):
        generate_device_map(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), 3)


def test_find_pippy_batch_size_looks_at_args_then_kwargs():
    assert find_pippy_batch_size(("text", torch.zeros(5, 2)), {"x": torch.zeros(7)}) == 5
    assert find_pippy_batch_size((), {"x": torch.zeros(7)}) == 7
    assert find_pippy_batch_size(None, None) is None
