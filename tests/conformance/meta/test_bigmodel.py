"""Meta-tests of the big-model cases: each ``broken_impls.bigmodel_*`` module must be reported.

The machinery is `support`'s (`Break` entries, shared switchboard
pools, the judgement of what was reported). Each backend's pool first runs
the reference over the same cases, which must all pass. The hook that does
not move inputs, invisible on the CPU alone, is in `test_bigmodel_npu`.

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.bigmodel_map_ignores_reserve --worlds 1 -k 'modeling.*' --no-manifest
"""

from __future__ import annotations

import pytest

from tests.conformance.meta.support import REFERENCE, Break, F, brk, judge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORLD = "1"
BIGMODEL = ("modeling.*", "bigmodel.*", "hooks.*")
TIMEOUT = 120.0

BREAKS = [
    brk("bigmodel_map_ignores_reserve", {"device_map_rules": F, "device_map_spills_and_cleans": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk(
        "bigmodel_map_splits_no_split",
        {"device_map_rules": F, "device_map_spills_and_cleans": F, "load_and_dispatch_cpu_disk": F},
        WORLD,
        BIGMODEL,
        # Balanced budgets are sized for whole blocks.
        collateral={"modeling.balanced_memory"},
        case_timeout=TIMEOUT,
    ),
    brk("bigmodel_disk_offload_reads_all", {"load_within_cpu_budget": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("bigmodel_offload_keeps_weights", {"cpu_and_disk_offload": F, "dispatch_cpu_disk": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("bigmodel_detach_keeps_meta", {"cpu_and_disk_offload": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("bigmodel_disk_without_folder", {"dispatch_cpu_disk": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("modeling_statistics_for_all", {"offload_roundtrip": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk(
        "bigmodel_retie_copies",
        {"modeling.tied_parameters": F, "modeling.tensor_to_device": F},
        WORLD,
        BIGMODEL,
        case_timeout=TIMEOUT,
    ),
    brk("bigmodel_load_keeps_untied", {"load_checkpoint_reties": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
]

PLAN = [Break(REFERENCE, {}, WORLD, BIGMODEL, case_timeout=TIMEOUT)] + BREAKS


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_suite_reports_bigmodel_breaks(entry: Break, request) -> None:
    # The judgement of `support.judge`, on this module's entries and the shared sim pool.
    judge(entry, request)
