"""``torch_xla.debug.metrics``: what compiling the step graphs cost (catalog ``xla.static_shapes``).

``UncachedCompile`` counts the graphs compiled, ``CachedCompile`` the steps
that reused one, ``metric_data("CompileTime")`` has the compile count first
(its times are zero: nothing is compiled really). ``metrics_report()``
ends with one line per recompilation, naming the step and the shapes.
"""
from __future__ import annotations

from simulators.devices.families import xla as _mock


def counter_names() -> list[str]:
    return ["CachedCompile", "UncachedCompile"]


def counter_value(name: str) -> int | None:
    graphs = _mock.GRAPHS
    return {"CachedCompile": graphs.cache_hits, "UncachedCompile": graphs.compiles}.get(name)


def metric_names() -> list[str]:
    return ["CompileTime"]


def metric_data(name: str) -> tuple[int, float, list] | None:
    """``(count, total time, samples)`` of ``name``; None for a metric the mock does not keep."""
    return (_mock.GRAPHS.compiles, 0.0, []) if name == "CompileTime" else None


def metrics_report() -> str:
    lines = [f"Metric: CompileTime\n  TotalSamples: {_mock.GRAPHS.compiles}"]
    lines += [f"Counter: {name}\n  Value: {counter_value(name)}" for name in counter_names()]
    lines += [f"Recompilation: {report}" for report in _mock.GRAPHS.recompilations]
    return "\n".join(lines) + "\n"


def short_metrics_report(counter_names: list[str] | None = None, metric_names: list[str] | None = None) -> str:
    return metrics_report()


def clear_all() -> None:
    """Forget the counts and the compiled graphs."""
    _mock.GRAPHS.reset()
