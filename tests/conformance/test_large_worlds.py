"""Issue 14: the Collectives, Inference helpers and Data loading sections at 16, 4x8 and 8x8 ranks.

Heavy (up to 64 ranks; about 70 s on an idle 2-core machine): `make extended` only.
"""
import io

import pytest

from conformance.catalog import area_of
from conformance.engine.case import LARGE_AREAS, LARGE_WORLDS
from conformance.engine.runner import RunOptions, execute

pytestmark = [pytest.mark.extended, pytest.mark.slow]


def test_large_preset_passes_on_accelerate_ref():
    run = execute(RunOptions(impl="accelerate_ref", worlds=["large"]), out=io.StringIO())
    assert {r.world for r in run.results} == set(LARGE_WORLDS)
    assert {area_of(r.id) for r in run.results} == set(LARGE_AREAS)
    problems = [f"{r.id} at {r.world}: {r.status.value} {r.message[:300]}" for r in run.results if r.status.is_problem]
    assert not problems, "\n".join(problems)
