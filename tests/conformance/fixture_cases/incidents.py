"""Cases that hang, crash, fail on one rank, or are unsupported.

Registered under the catalog-like ID prefix ``fixture.`` so they can never
be mistaken for suite cases.
"""

from __future__ import annotations

import os
import time

from conformance.engine.case import NotSupported, case
from conformance.support.checks import expect_equal


def stuck_here() -> None:
    time.sleep(3600)


@case("fixture.hang", worlds=[2])
def last_rank_hangs(impl, world):
    if world.rank == world.size - 1:
        stuck_here()
    return world.rank


#: A file the test names: ``slow_the_first_time`` is slow while it is missing (then creates it).
SLOW_MARKER_ENV = "CONFORMANCE_FIXTURE_SLOW_MARKER"


@case("fixture.slow", worlds=[2])
def slow_the_first_time(impl, world):
    """Past any short timeout on its first run (rank 0 sleeps), quick on the next: slow, not hung."""
    marker = os.environ[SLOW_MARKER_ENV]
    if world.rank == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(60)
    return world.rank


@case("fixture.fail_then_hang", worlds=[2])
def rank0_fails_rank1_waits(impl, world):
    acc = impl.Accelerator()
    if world.rank == 0:
        raise AssertionError("rank 0 saw the wrong thing")
    acc.wait_for_everyone()


@case("fixture.crash", worlds=[2])
def rank0_aborts(impl, world):
    if world.rank == 0:
        os.abort()
    stuck_here()


@case("fixture.check_fails", worlds=[2])
def values_differ(impl, world):
    return world.rank


@values_differ.check
def _all_equal(values, world):
    expect_equal(values, [0] * world.size, "per-rank values")


@case("fixture.not_supported", worlds=[2])
def not_supported(impl, world):
    raise NotSupported("this implementation has no teleporter")


@case("fixture.passes", worlds=[2])
def passes(impl, world):
    acc = impl.Accelerator()
    acc.wait_for_everyone()
    return acc.process_index
