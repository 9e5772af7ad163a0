"""Meta-tests of the big-model cases on ``sim-npu``: a hook that does not move inputs, and a ``prepare``
that moves a dispatched model onto the main device, must be reported.

On the CPU alone nothing needs moving, so the break shows only where a
model spreads over several accelerators: the ``*_npus`` cases put one over
four mock NPUs (``SIMULATORS_NPU_DEVICE_COUNT=4``), where a tensor of npu:1
meeting one of npu:0 fails as on hardware. The reference runs first over
the same cases and must pass them all.

To reproduce by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.bigmodel_hook_keeps_inputs --backend sim-npu --worlds 1 -k 'bigmodel.*' --no-manifest
"""

from __future__ import annotations

import pytest

from conformance.engine.backends import SimNpuBackend
from tests.conformance.meta.support import Break, E, F, brk, judge, plan, pools_fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORLD = "1"
BIGMODEL = ("bigmodel.*", "hooks.*")
TIMEOUT = 120.0

BREAKS = [
    brk(
        "bigmodel_hook_keeps_inputs",
        {"dispatch_across_npus": (F, E), "dispatch_tied_offloaded": (F, E)},
        WORLD,
        BIGMODEL,
        # Every forward through hooks across devices meets the unmoved input.
        collateral={"bigmodel.load_checkpoint_and_dispatch", "bigmodel.cpu_offload"},
        case_timeout=TIMEOUT,
    ),
    brk("bigmodel_outputs_go_back", {"dispatch_across_npus": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("bigmodel_tied_copies_kept", {"dispatch_tied_offloaded": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("bigmodel_warns_without_offload", {"dispatch_across_npus": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk("bigmodel_low_0_as_balanced", {"load_and_dispatch_npus": F}, WORLD, BIGMODEL, case_timeout=TIMEOUT),
    brk(
        "bigmodel_prepare_moves_dispatched",
        {"prepare_keeps_npu_map": F, "prepare_keeps_cpu_disk_map": F},
        WORLD,
        ("prepare.verify_device_map",),
        case_timeout=TIMEOUT,
    ),
]

PLAN = plan(BREAKS, case_timeout=TIMEOUT)


shared_pools = pools_fixture(SimNpuBackend)


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_sim_npu_reports_hook_break(entry: Break, request) -> None:
    # The judgement of `support.judge`, on this module's entries and its sim-npu pool.
    judge(entry, request)
