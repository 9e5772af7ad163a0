"""Meta-tests of the "Saving and loading" cases and the custom-tracker "Tracking" case: each ``broken_impls.save_*`` module must be reported.

The machinery is `support`'s (`Break` entries, shared switchboard
pools, the judgement of what was reported: the broken rule's ID gets the
expected status, every other ID of the selection passes unless named as
collateral). Each world used here first runs the reference over the same
cases, which must all pass. Cases that build models have a longer timeout
of their own (see `conformance.support.training.MODEL_CASE_TIMEOUT`).

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.save_total_limit_deletes_newest --worlds 1 -k 'save_state.*' --no-manifest
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
from packaging.version import Version

from conformance.engine.results import Status
from tests.conformance.meta.support import REFERENCE, Break, E, F, brk, judge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: Every case of the two sections but save.transformers_save_pretrained (NOT_SUPPORTED without Transformers).
SAVING = (
    "save.once_per_machine",
    "save.array_example",
    "save_model.*",
    "save_state.*",
    "shard_checkpoint.*",
    "get_state_dict.*",
    "register_for_checkpointing",
    # The custom-tracker case of tracking.init_log_end; its real-tracker cases are NOT_SUPPORTED
    # without their packages, so they are test_tracking's.
    "tracking_init_log_end",
)

BREAKS = [
    brk("save_every_rank", {"save.once_per_machine": F}, "2", SAVING),
    brk("save_resume_replays_epoch_zero", {"save_state.resume_data_order": F}, "1", SAVING),
    brk("save_resume_redraws_loader_seed", {"save_state_resume_as_documented": F}, "2", SAVING),
    brk("save_resume_replays_finished_epoch", {"save_state.resume_data_order": F}, "2", SAVING),
    brk("save_total_limit_deletes_newest", {"save_state.total_limit": F}, "1", SAVING),
    brk("save_hooks_not_removable", {"save_state.pre_hooks": F}, "1", SAVING),
    brk("save_rng_of_rank_zero", {"save_state.roundtrip": F}, "2", SAVING),
    brk("save_shards_by_size", {"shard_checkpoint.doc_example": F}, "1", SAVING),
    brk("save_load_oldest_checkpoint", {"save_state.auto_naming": F, "save_state.total_limit": F}, "1", SAVING),
    brk("save_register_accepts_anything", {"register_for_checkpointing": F}, "1", SAVING),
    brk("save_tracker_on_every_rank", {"tracking.init_log_end": F}, "2", SAVING),
    brk("save_model_ignores_shard_size", {"save_model.sharded": F}, "1", SAVING),
]

#: Per world, the reference first (it must pass every case the breaks use), then the breaks, in one pool.
PLAN = [entry for world in ("1", "2") for entry in [Break(REFERENCE, {}, world, SAVING)] + [b for b in BREAKS if b.world == world]]

#: With 🤗 Transformers installed (extra `transformers`), its case too. Transformers 4 calls save_pretrained's
#: save_function (accelerator.save) on every rank: a save on every rank is caught there. Transformers 5 ignores
#: save_function (and writes on rank 0 itself): the reference is NOT_SUPPORTED there, naming why
#: (test_transformers_5_case_names_the_dropped_hook), and the rest of the pattern still catches a break:
#: unwrap_model returning the DDP wrapper, under both.
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
#: Read from the installed version, not by importing Transformers (seconds) when the module is collected.
TRANSFORMERS_HOOK = HAS_TRANSFORMERS and Version(importlib.metadata.version("transformers")).major < 5
TRANSFORMERS = ("save.once_per_machine", "save.transformers_save_pretrained")
if HAS_TRANSFORMERS:
    NS = frozenset({Status.NOT_SUPPORTED})
    PLAN += [
        Break(REFERENCE, {} if TRANSFORMERS_HOOK else {"save.transformers_save_pretrained": NS}, "2", TRANSFORMERS),
        brk("train_unwrap_returns_wrapper", {"save.transformers_save_pretrained": E}, "2", TRANSFORMERS),
    ]
    if TRANSFORMERS_HOOK:
        PLAN.append(brk("save_every_rank", {"save.once_per_machine": F, "save.transformers_save_pretrained": F}, "2", TRANSFORMERS))


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_suite_reports_saving_breaks(entry: Break, request) -> None:
    # The judgement of `support.judge`, on this module's entries and pool.
    judge(entry, request)


@pytest.mark.skipif(not HAS_TRANSFORMERS or TRANSFORMERS_HOOK, reason="only Transformers 5 ignores save_pretrained's save_function")
def test_transformers_5_case_names_the_dropped_hook(shared_pools) -> None:
    """Under Transformers 5 the case checks the rest of the pattern, then says why accelerator.save went unchecked."""
    results = shared_pools.run(Break(REFERENCE, {}, "2", ("save.transformers_save_pretrained",)))
    assert [r.status for r in results] == [Status.NOT_SUPPORTED], results
    assert "ignores save_function" in results[0].message and "accelerate#3913" in results[0].message, results[0].message
