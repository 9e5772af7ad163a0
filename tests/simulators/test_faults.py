"""The fault catalog (issue 14): each fault diagnosed within its timeout, nothing left running.

The fast faults run in `make test`; the whole catalog (and a SIGKILLed
driver) under `extended` and `make faults`.
"""
import pytest

from tests.simulators import faults

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if f.fast], ids=lambda f: f.name)
def test_fast_fault(fault):
    verdict = faults.run_fault(fault)
    assert verdict.ok, verdict


@pytest.mark.extended
@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if not f.fast], ids=lambda f: f.name)
def test_fault(fault):
    verdict = faults.run_fault(fault)
    assert verdict.ok, verdict


@pytest.mark.extended
def test_driver_sigkilled_leaves_nothing():
    verdict = faults.run_driver_killed()
    assert verdict.ok, verdict
