"""Meta-tests of the "Saving and loading" and "Tracking" cases: each ``broken_impls.save_*`` module must be reported.

The machinery is `test_meta_suite`'s (`Break` entries, shared switchboard
pools, the judgement of what was reported: the broken rule's ID gets the
expected status, every other ID of the selection passes unless named as
collateral). Each world used here first runs the reference over the same
cases, which must all pass. Cases that build models have a longer timeout
of their own (see `conformance.cases.test_training.MODEL_CASE_TIMEOUT`).

To reproduce one break by hand::

    PYTHONPATH=tests python -m conformance run --impl broken_impls.save_total_limit_deletes_newest --worlds 1 -k 'save_state.*' --no-manifest
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from conformance.case import all_cases
from conformance.results import Status
from tests.test_meta_suite import F, REFERENCE, Break, SharedPools, brk
from tests.test_meta_suite import test_suite_reports as check_entry

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
    "tracking.*",
)

BREAKS = [
    brk("save_every_rank", {"save.once_per_machine": F}, "2", SAVING),
    brk("save_resume_replays_epoch_zero", {"save_state.resume_data_order": F}, "1", SAVING),
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


@pytest.fixture(scope="module")
def shared_pools(tmp_path_factory):
    pools = SharedPools(tmp_path_factory.mktemp("switchboard") / "choice")
    yield pools
    pools.close()


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_suite_reports_saving_breaks(entry: Break, request) -> None:
    # The judgement of test_meta_suite, on this module's entries and pool.
    check_entry(entry, request)


def test_every_saving_break_is_planned_and_documented() -> None:
    """Each ``broken_impls/save_*`` module has an entry here, expected as FAIL, whose docstring names the IDs that catch it."""
    import broken_impls

    modules = {m.name for m in pkgutil.iter_modules(broken_impls.__path__) if m.name.startswith("save_")}
    planned = {b.name for b in BREAKS}
    assert modules == planned, f"unplanned: {sorted(modules - planned)}, missing modules: {sorted(planned - modules)}"
    ids = {c.id for c in all_cases()}
    for b in BREAKS:
        doc = importlib.import_module(b.impl).__doc__ or ""
        assert set(b.caught) <= ids, f"{b.impl}: no case has ID(s) {sorted(set(b.caught) - ids)}"
        assert all(cid in doc for cid in b.caught), f"{b.impl}: the docstring should name {sorted(b.caught)}"
        assert all(statuses == {Status.FAIL} for statuses in b.caught.values()), f"{b.impl}: a wrong value is a FAIL"
