"""The whole suite, as `make conformance` runs it, against the reference and HF accelerate.

The reference must pass every case at every default world; HF accelerate
must pass except for the deviations its bundled manifest lists, and every
listed deviation must still happen (strict: no unexpected pass).

`make test` runs HF at worlds 1 and 2 (one process, several: its manifest has
entries for each, and a manifest entry no result matched at a world that ran
fails the run) and the reference at 1 and 2x2, both without the "Launching"
section, which keeps them within the time budget of `make test`. The reference is
what changes from one commit to the next; HF is pinned (1.15), so its run checks
the cases and the manifest. The `extended` variants run both whole at all five
default worlds (3 adds an uneven world, 4 the largest, 2x2 several machines). The
"Launching" section starts the implementation's own command line some twenty
times, each launch starting fresh ranks: 45 of the 64 s its cases took for the
reference at worlds 1, 2 and 2x2 on a 2-core machine (2026-11-30). In `make test` the reference's launcher
is checked against HF's in process (tests/accelerate_ref/commands/test_launch.py,
test_accelerate_cli.py) and end to end by the state.clean_exit and dry-run tests.

Each run uses the suite's default case timeout: a case slowed past it by a busy
machine runs again alone with twice as long before it is called hung, and HF's
expected hang (join.uneven_inputs) ends at it.
"""

from __future__ import annotations

import re

import pytest

from conformance import catalog
from conformance.engine import levels
from conformance.engine.case import all_cases
from conformance.engine.manifest import Manifest
from conformance.engine.results import Status
from conformance.engine.runner import DEFAULT_WORLDS, RunOptions, execute

# The whole suite at five worlds outlasts the 300 s default per test (HF: about 370 s here).
pytestmark = [pytest.mark.slow, pytest.mark.longest, pytest.mark.timeout(1500)]

#: The only reasons the reference may give for NOT_SUPPORTED: an optional package that is absent
#: (or present, where a case checks what its absence does), or a limit of torch on this machine
#: (a gloo-less collective, say). Anything else would be a stub passing as a limit.
NAMED_LIMIT = re.compile(r"is not installed|is installed here|torch limit")


#: HF's worlds in `make test`: a single process, several processes (2x2 under extended).
HF_FAST_WORLDS = ("1", "2")
#: The reference's in `make test`: a single process, and several processes on several machines.
REFERENCE_FAST_WORLDS = ("1", "2x2")
#: The catalog sections `make test`'s runs leave to the `extended` ones (see the module docstring).
FAST_SKIPPED_AREAS = ("Launching",)


def case_ids(areas: tuple[str, ...], inside: bool) -> tuple[str, ...]:
    """The IDs of the suite's cases in a catalog section of ``areas`` (``inside``), or in none of them."""
    return tuple(sorted({c.id for c in all_cases() if (catalog.area_of(c.id) in areas) == inside}))


def run_suite(impl: str, capsys, worlds: tuple[str, ...] = DEFAULT_WORLDS, patterns: tuple[str, ...] = (),
              level: str = levels.DEFAULT_LEVEL) -> tuple:
    manifest = Manifest.bundled(impl)
    run = execute(RunOptions(impl=impl, worlds=worlds, patterns=patterns, manifest=manifest, strict=True, level=level))
    output = capsys.readouterr().out
    problems = [f"{r.status.value} {r.id}[{r.world}]: {r.message[:400]}" for r in run.results if r.status.is_problem]
    return run, manifest, output, problems


@pytest.mark.parametrize(
    "worlds", [REFERENCE_FAST_WORLDS, pytest.param(DEFAULT_WORLDS, marks=pytest.mark.extended)], ids=["fast-worlds", "all-worlds"]
)
def test_reference_passes_every_case(capsys, worlds):
    selected = case_ids(FAST_SKIPPED_AREAS, inside=False) if worlds == REFERENCE_FAST_WORLDS else ()
    run, _, output, problems = run_suite("accelerate_ref", capsys, worlds, selected)
    assert run.results, "no case ran"
    assert problems == [], output
    unsupported = [
        f"{r.id}[{r.world}]: {r.message[:200]}"
        for r in run.results
        if r.status == Status.NOT_SUPPORTED and not NAMED_LIMIT.search(r.message)
    ]
    assert unsupported == [], f"the reference reports features as unsupported without naming a package or torch limit: {unsupported}"


@pytest.mark.extended
@pytest.mark.parametrize("level", levels.LEVELS[:-1])
def test_reference_passes_every_level(capsys, level):
    """At the documents' levels the cases spell the API as those documents do; the reference passes them all."""
    run, _, output, problems = run_suite("accelerate_ref", capsys, ("1", "2", "2x2"), level=level)
    assert run.results and run.metadata["beyond_level"], output
    assert problems == [], output


@pytest.mark.parametrize(
    "worlds", [HF_FAST_WORLDS, pytest.param(DEFAULT_WORLDS, marks=pytest.mark.extended)], ids=["fast-worlds", "all-worlds"]
)
def test_hf_accelerate_passes_except_its_manifest(capsys, worlds):
    pytest.importorskip("accelerate")
    selected = case_ids(FAST_SKIPPED_AREAS, inside=False) if worlds == HF_FAST_WORLDS else ()
    run, manifest, output, problems = run_suite("accelerate", capsys, worlds, selected)
    assert problems == [], output
    if selected:
        skipped = {r.id for r in run.results if catalog.area_of(r.id) in FAST_SKIPPED_AREAS}
        assert run.results and not skipped, f"cases of {FAST_SKIPPED_AREAS} ran: {sorted(skipped)}"
    unexpected = [f"{r.id}[{r.world}]" for r in run.unexpected_passes]
    assert unexpected == [], f"manifest entries that HF now passes (remove or narrow them): {unexpected}"
    assert manifest is not None, "HF accelerate's bundled manifest is missing"
    unused = [f"{d.id} {d.worlds or ''}" for d in manifest.unused(among=selected or None)]
    assert unused == [], f"manifest entries that matched no result: {unused}"
