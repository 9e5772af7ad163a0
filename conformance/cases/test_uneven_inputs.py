"""Catalog section "Training": uneven inputs (``join_uneven_inputs``)."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ..engine.case import DEFAULT_CASE_TIMEOUT
from ..support.checks import expect_equal

from ..support.training import (
    case,
    expect_close,
    index_batches,
    sample_loss,
    sgd_of,
    tiny_linear,
    weights_of,
)


def _uneven_steps(acc: Any, model: Any, optimizer: Any, batches: Iterable[Any]) -> int:
    count = 0
    for indices in batches:
        acc.backward(sample_loss(model, indices, acc.device))
        optimizer.step()
        optimizer.zero_grad()
        count += 1
    return count


#: HF hangs here (its manifest expects it): the run's default timeout, not the training cases' longer one, so that an
#: expected HANG ends soon; a reference slowed past it by a busy machine is run again alone before it is called hung.
@case("join.uneven_inputs", worlds=["1", "2", "3"], timeout=DEFAULT_CASE_TIMEOUT)
def join_uneven_inputs(impl, world):
    """``join_uneven_inputs([ddp_model], even_batches=False)`` trains to the end when ranks have different batch counts.

    First, rank r trains on r + 1 batches of its own inside the block (an
    implementation whose block does nothing leaves the longer ranks waiting
    in DDP's all-reduce: reported as HANG). Then the documented example: a
    prepared loader of ``2 * ranks + 1`` samples, batch size 1, with
    ``even_batches=False`` given to the block: rank 0 gets 3 batches, the
    others 2; after the block the loader is even again. Weights must agree
    on every rank. A no-op on one process.
    """
    acc = impl.Accelerator()
    model = tiny_linear()
    loader = torch.utils.data.DataLoader(list(range(2 * world.size + 1)), batch_size=1)
    model, optimizer, loader = acc.prepare(model, sgd_of(model), loader)
    with acc.join_uneven_inputs([model], even_batches=False):
        own = _uneven_steps(acc, model, optimizer, index_batches(world, world.rank + 1))
    with acc.join_uneven_inputs([model], even_batches=False):
        inside = _uneven_steps(acc, model, optimizer, loader)
    after = len(list(loader))
    return {"own": own, "inside": inside, "after": after, "weights": weights_of(acc.unwrap_model(model))}


@join_uneven_inputs.check
def _joined_to_the_end(values, world):
    n = world.size
    expect_equal([v["own"] for v in values], [r + 1 for r in range(n)], "batches each rank trained on, rank r having r + 1")
    expected_inside = [3] + [2] * (n - 1)
    expect_equal([v["inside"] for v in values], expected_inside, "batches per rank inside join_uneven_inputs(even_batches=False)")
    expect_equal([v["after"] for v in values], [3] * n, "batches per rank after the block (even_batches restored)")
    for rank, value in enumerate(values):
        expect_close(value["weights"], values[0]["weights"], f"rank {rank}: weights vs rank 0's after joined training")
