"""XLA's step graphs as the mock counts them (``simulators.devices.families.steps``), in this process.

Rules: a step's graph is its ops and their shapes; a graph seen before runs
from the cache; new ops compile once; the same ops with new shapes are a
recompilation, warned about with the step and the shapes.
"""
from __future__ import annotations

import pytest

from simulators.devices.families.steps import StepGraphs, XlaRecompilationWarning


def _step(graphs: StepGraphs, *shapes: tuple[int, ...]) -> str | None:
    graphs.record("aten.mm", shapes)
    graphs.record("aten.sum", shapes[:1])
    return graphs.mark_step()


def test_static_shapes_compile_once_then_hit_the_cache():
    graphs = StepGraphs()
    reports = [_step(graphs, (8, 4), (4, 1)) for _ in range(5)]
    assert reports == [None] * 5
    assert (graphs.compiles, graphs.cache_hits, graphs.step) == (1, 4, 5)


def test_new_ops_compile_without_being_a_recompilation():
    graphs = StepGraphs()
    _step(graphs, (8, 4), (4, 1))
    graphs.record("xm.all_gather", [(8, 4)])
    assert graphs.mark_step() is None
    assert graphs.compiles == 2 and graphs.recompilations == []


def test_changed_shapes_are_a_recompilation_naming_the_step_and_shapes():
    graphs = StepGraphs()
    _step(graphs, (8, 4), (4, 1))
    with pytest.warns(XlaRecompilationWarning) as caught:
        report = _step(graphs, (5, 4), (4, 1))
    assert report == str(caught[0].message) == graphs.recompilations[0]
    assert "step 2" in report and "[8, 4] became [5, 4]" in report and "compiled 2 times" in report
    assert _step(graphs, (5, 4), (4, 1)) is None, "the new shapes are cached from now on"


def test_an_empty_step_compiles_nothing_and_reset_forgets_everything():
    graphs = StepGraphs()
    assert graphs.mark_step() is None and graphs.compiles == 0 and graphs.step == 1
    _step(graphs, (1,))
    graphs.reset()
    assert (graphs.compiles, graphs.cache_hits, graphs.step, graphs.recompilations) == (0, 0, 0, [])
