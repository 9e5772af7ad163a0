"""Meta-tests on the mock XLA device: the suite catches device bugs that CPU worlds cannot see.

Each ``tests/conformance/meta/broken_impls/device_*.py`` module breaks a rule in a way that
is invisible when the accelerator is the CPU: batches left on the CPU, a
CUDA-only call on another accelerator. The machinery is that of
``support.py`` (same `Break` entries, judgement and switchboard
pool), on the ``sim-xla`` backend at world 2, after a reference control
over the same cases; a last test runs the breaks on ``sim`` and sees them
pass there, which is why the mock devices exist.

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.device_batches_on_cpu --backend sim-xla --worlds 2 -k 'data.*' --no-manifest
"""

from __future__ import annotations

import importlib
import io

import pytest

from conformance.engine.backends import SimXlaBackend
from conformance.engine.results import Status
from conformance.engine.runner import RunOptions, execute
from tests.conformance.meta.support import PROCESS, REFERENCE, Break, E, F, brk, judge, pools_fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORLD = "2"
DATA = ("data.*",)

BREAKS = [
    brk("device_batches_on_cpu", {"data.device_placement": F}, WORLD, DATA),
    brk(
        "device_cuda_synchronize",
        {"sync.wait_for_everyone": (F, E)},
        WORLD,
        PROCESS,
        # Both rest on the barrier.
        collateral={"sync.main_process_first", "sync.local_main_process_first"},
    ),
]

#: The reference first (it must pass every case the breaks use), then the breaks, sharing one pool.
PLAN = [Break(REFERENCE, {}, WORLD, tuple(dict.fromkeys(p for b in BREAKS for p in b.patterns)))] + BREAKS


shared_pools = pools_fixture(SimXlaBackend)


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_sim_xla_reports_device_breaks(entry: Break, request) -> None:
    # The judgement of `support.judge`, run on this module's entries and its sim-xla pool.
    judge(entry, request)


def test_the_device_breaks_pass_in_cpu_worlds() -> None:
    """On ``sim`` every caught case of these breaks passes: only a device other than the CPU shows them."""
    caught = sorted({key for b in BREAKS for key in b.caught})
    for b in BREAKS:
        importlib.import_module(b.impl)
        options = RunOptions(impl=b.impl, backend="sim", worlds=[WORLD], patterns=list(b.caught), manifest=None)
        results = execute(options, out=io.StringIO()).results
        assert results and all(r.status is Status.PASS for r in results), (
            f"{b.impl} on sim: " + ", ".join(f"{r.id}={r.status.value}" for r in results) + f" (caught IDs: {caught})"
        )
