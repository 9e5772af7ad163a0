"""Meta-tests of the data-loading cases: the suite catches deliberately broken data loading.

Each ``tests/conformance/meta/broken_impls/data_*.py`` module breaks one rule of the catalog
sections "Data loading" and the ``gather_for_metrics`` rows. The machinery
is that of ``support.py`` (same `Break` entries, shared switchboard
pools, same judgement of the results: the broken rule's ID gets the
expected status, every other ID of the selection passes unless named as
collateral); here it runs the data cases at world 2, after a reference
control over the same cases.

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.data_skip_off_by_one --worlds 2 -k 'data.*' --no-manifest
"""

from __future__ import annotations

import pytest

from tests.conformance.meta.support import REFERENCE, Break, F, brk, judge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORLD = "2"
DATA = ("data.*", "gather_for_metrics.*")
DATA_ONLY = ("data.*",)
GATHER_FOR_METRICS = ("gather_for_metrics.doc_example", "gather_for_metrics.tuple", "gather_for_metrics.use_gather_object", "gather_for_metrics.full_epoch")

BREAKS = [
    brk("data_shuffle_not_synced", {"data.shuffle_sync": F}, WORLD, DATA),
    # Unpadded last steps make gather_for_metrics gather tensors of different shapes: data cases only.
    brk("data_even_batches_ignored", {"data.even_batches": F}, WORLD, DATA_ONLY),
    brk("data_skip_off_by_one", {"data.skip_first_batches": F}, WORLD, DATA),
    brk("data_len_unsharded", {"data.len_after_prepare": F, "data.effective_batch": F}, WORLD, DATA),
    brk("data_remainder_counts_padding", dict.fromkeys(GATHER_FOR_METRICS, F), WORLD, DATA),
    brk("data_gather_for_metrics_keeps_duplicates", dict.fromkeys(GATHER_FOR_METRICS, F), WORLD, DATA),
    brk("data_dispatch_every_rank_reads", {"data.dispatch_batches": F}, WORLD, DATA),
    brk(
        "data_iterable_shard_drops_last",
        {"data.iterable_dataset": F},
        WORLD,
        DATA,
        # The lost samples are missing from the gathered epoch and from the batches len() promised.
        collateral={"gather_for_metrics.full_epoch", "data.len_after_prepare"},
    ),
    brk("data_split_batches_ignored", {"data.split_batches": F}, WORLD, DATA),
    brk(
        "data_seedable_sampler_ignored",
        {"data.seedable_sampler": F},
        WORLD,
        DATA,
        # skip_first_batches is checked on a seedable shuffled loader too.
        collateral={"data.skip_first_batches"},
    ),
    brk("data_batches_not_placed", {"data.device_placement": F}, WORLD, DATA),
]

#: The reference first (it must pass every case the breaks use), then the breaks, sharing one pool.
PLAN = [Break(REFERENCE, {}, WORLD, DATA)] + BREAKS


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_suite_reports_data_breaks(entry: Break, request) -> None:
    # The judgement of `support.judge`, run on this module's entries and pool (the
    # ``shared_pools`` fixture it asks for is this module's).
    judge(entry, request)
