"""Meta-tests of the "Launching" cases: each broken launcher is caught by the case of its rule.

Every ``tests/conformance/meta/broken_impls/`` module used here breaks one launching rule of
the reference (a launcher that runs one process for ``--cpu -n N``, a failed
launch that exits 0, a config file ignored, no refusal in
``notebook_launcher``, a logger on every rank, ``write_basic_config``
overwriting). The reference passes the same cases in ``test_conformance_full``.
Launching processes is slow on a small machine, so only the two in-pool
breaks run in ``make test``; the launcher breaks are ``extended``.

To reproduce one by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.launch_failure_exits_zero --worlds 2 -k launch.failure --no-manifest
"""

from __future__ import annotations

import io

import pytest

from conformance.engine.runner import RunOptions, execute
from tests.conformance.meta.support import Break, F, brk

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: Launcher breaks (``extended``: each launches torch processes several times).
LAUNCHER_BREAKS = [
    brk("launch_cpu_single_process", {"launch.cpu_ranks": F}, "2", ("launch.cpu_ranks",)),
    brk("launch_failure_exits_zero", {"launch.failure": F}, "2", ("launch.failure",)),
    brk(
        "launch_config_ignored",
        {"launch.config_file": F, "launch.config_location": F, "config.write_basic_config": F},
        "1",
        ("launch.config_file", "launch.config_location", "config.write_basic_config"),
    ),
    brk("launch_config_ignored", {"launch.cli": F}, "2", ("launch.cli",)),
    brk("notebook_launcher_no_refusal", {"launch.notebook_launcher": F}, "2", ("launch.notebook_launcher",)),
]
#: Breaks caught without a launch of the broken launcher (run in ``make test``).
IN_POOL_BREAKS = [
    brk("logger_every_rank", {"logging.get_logger": F}, "2", ("logging.get_logger",)),
    brk("basic_config_overwrites", {"config.write_basic_config": F}, "1", ("config.write_basic_config",)),
]
#: Read by ``test_suite.test_every_break_is_planned_and_documented`` (from the source).
BREAKS = LAUNCHER_BREAKS + IN_POOL_BREAKS


def run_break(entry: Break) -> None:
    run = execute(RunOptions(impl=entry.impl, worlds=[entry.world], patterns=list(entry.patterns), manifest=None), out=io.StringIO())
    statuses = {r.id: r.status for r in run.results}
    assert set(statuses) == set(entry.caught), f"cases that ran: {sorted(statuses)}"
    not_caught = {cid for cid, status in statuses.items() if status not in entry.caught[cid]}
    assert not not_caught, f"{entry.impl} at world {entry.world} was not caught: " + "; ".join(
        f"{r.id}: {r.status.value} {r.message[:300]}" for r in run.results if r.id in not_caught
    )


@pytest.mark.parametrize("entry", IN_POOL_BREAKS, ids=lambda entry: entry.label)
def test_in_pool_break_is_caught(entry: Break) -> None:
    run_break(entry)


@pytest.mark.extended
@pytest.mark.parametrize("entry", LAUNCHER_BREAKS, ids=lambda entry: entry.label)
def test_launcher_break_is_caught(entry: Break) -> None:
    run_break(entry)
