"""The suite's runner diagnoses what goes wrong inside ranks, and recovers.

Uses the deliberately misbehaving cases of ``tests/fixture_cases`` on the
simulator backend against the reference.
"""

from __future__ import annotations

import pytest

from conformance.engine.backends import SimBackend
from conformance.engine.results import Status
from simulators.topology import World
from tests.conformance.fixture_cases import incidents
from tests.processes import children_of, still_running

pytestmark = pytest.mark.slow
WORLD = World.of(2)


@pytest.fixture(scope="module")
def backend():
    sim = SimBackend("accelerate_ref", case_timeout=4.0)
    yield sim
    server = sim.fork_server_pid
    assert server is not None, "the backend never started its fork server"
    processes = [server, *children_of(server)]
    sim.close()
    assert still_running(processes) == [], "the fork server or its ranks survived backend.close()"


def test_hang_reports_stacks_and_the_pool_recovers(backend):
    result = backend.run_case(incidents.last_rank_hangs, WORLD)
    assert result.status == Status.HANG, result.message
    assert result.message.startswith("HANG confirmed: it hung again alone in fresh ranks, given 8 s"), result.message
    assert "stuck_here" in result.stacks.get(1, ""), f"rank 1's stack should show where it hangs: {result.stacks}"
    assert "stuck_here" in result.message
    assert backend.run_case(incidents.passes, WORLD).status == Status.PASS


def test_a_slow_case_is_run_again_alone_and_reported_as_slow_not_hung(tmp_path):
    """Issue 32: a case past its timeout in long-lived ranks (a garbage collection, a slow day) is no HANG."""
    sim = SimBackend("accelerate_ref", case_timeout=3.0, env={incidents.SLOW_MARKER_ENV: str(tmp_path / "marker")})
    try:
        result = sim.run_case(incidents.slow_the_first_time, WORLD)
    finally:
        sim.close()
    assert result.status == Status.PASS, result.message
    assert result.message.startswith("slow, not hung: past its 3 s timeout in the run's ranks, it ended PASS alone in fresh ranks"), result.message


def test_a_hang_the_manifest_expects_is_not_run_again(backend):
    backend.confirm_hang = lambda hung: False
    try:
        result = backend.run_case(incidents.last_rank_hangs, WORLD)
    finally:
        backend.confirm_hang = lambda hung: True
    assert result.status == Status.HANG and "confirmed" not in result.message, result.message
    assert result.duration_s < 8, f"one run of 4 s, not two: {result.duration_s} s"


def test_a_failure_that_makes_the_others_hang_is_reported_as_the_failure(backend):
    result = backend.run_case(incidents.rank0_fails_rank1_waits, WORLD)
    assert result.status == Status.FAIL, result.message
    assert "rank 0 saw the wrong thing" in result.message
    assert "[1] did not finish" in result.message
    assert backend.run_case(incidents.passes, WORLD).status == Status.PASS


def test_crash_names_the_signal_and_the_pool_recovers(backend):
    result = backend.run_case(incidents.rank0_aborts, WORLD)
    assert result.status == Status.CRASH, result.message
    assert "SIGABRT" in result.message, result.message
    assert backend.run_case(incidents.passes, WORLD).status == Status.PASS


def test_driver_side_check_turns_disagreement_into_fail(backend):
    result = backend.run_case(incidents.values_differ, WORLD)
    assert result.status == Status.FAIL
    assert "expected [0, 0], got [0, 1]" in result.message


def test_not_supported_is_kept_apart(backend):
    result = backend.run_case(incidents.not_supported, WORLD)
    assert result.status == Status.NOT_SUPPORTED
    assert "teleporter" in result.message


def test_results_carry_what_the_reports_need(backend):
    result = backend.run_case(incidents.passes, WORLD).to_json()
    for key in ("id", "status", "world", "backend", "impl", "duration_s", "ranks"):
        assert key in result, key
    assert (result["id"], result["status"], result["world"], result["backend"], result["impl"]) == (
        "fixture.passes", "PASS", "2", "sim", "accelerate_ref",
    )
    assert [r["rank"] for r in result["ranks"]] == [0, 1]


def test_cases_registered_outside_the_suite_are_not_part_of_it():
    from conformance.engine.case import all_cases

    ids = {c.id for c in all_cases()}
    assert "state.attributes" in ids
    assert not any(i.startswith("fixture.") for i in ids), "fixture cases leaked into the suite"


def test_coverage_warning_names_only_cases_that_run_at_none_of_the_worlds():
    """A world-generic case of the large areas runs at ``--worlds large`` (Case.runs_at), so the
    warning must not name it; a case whose worlds are all small must be named."""
    from conformance.engine.runner import RunOptions, _coverage_warnings, all_cases, parse_worlds

    cases = all_cases()
    (warning,) = _coverage_warnings(cases, parse_worlds("large"), RunOptions(impl="accelerate_ref", manifest=None))
    idle = set(warning.split(": ", 1)[1].split(", "))
    scaling = {c.id for c in cases if c.scales}
    assert scaling, "no case runs at the large worlds: the check below would be empty"
    assert idle.isdisjoint(scaling), f"cases that do run at the large worlds named as idle: {sorted(idle & scaling)}"
    assert "launch.cli" in idle, "a case written for world 2 only must be named at the large worlds"


def test_the_fork_server_imports_what_the_cases_to_run_declare():
    """``expect(cases)`` has every later world's ranks start with the cases' declared imports done (the server
    is replaced at the next world); ranks of a backend that was told nothing start without them."""
    from tests.conformance.fixture_cases import imports

    sim = SimBackend("accelerate_ref", case_timeout=10.0)
    try:
        untold = sim.run_case(imports.declared_import_loaded, World.of(1))
        sim.expect([imports.declared_import_loaded])
        told = sim.run_case(imports.declared_import_loaded, World.of(2))
    finally:
        sim.close()
    assert untold.status == Status.FAIL and "[False]" in untold.message, untold.message
    assert told.status == Status.PASS, told.message
