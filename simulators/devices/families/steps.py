"""XLA's step graphs and compile cache, as users meet them: recompilations when shapes change.

Rules (catalog ``xla.static_shapes``; the quicktour's TPU notes: dynamic
padding and shape-changing loops make training slow):

- every op on an XLA tensor (and every ``xm`` collective) joins the graph of
  the current step; ``mark_step`` ends the step and runs its graph;
- a graph runs from the cache when a graph with the same ops and the same
  shapes ran before; otherwise it is compiled (``UncachedCompile``
  increases; ``CachedCompile`` counts the cache hits);
- a compilation of a graph whose ops ran before with other shapes is a
  *recompilation*: it is warned about (`XlaRecompilationWarning`) and
  reported, naming the step and the shapes that changed. A new graph (other
  ops: evaluation after training, a collective) compiles once and is not a
  recompilation.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

#: Distinct shapes kept per step for the report (the graph's identity uses them all).
_SHAPES_KEPT = 32


class XlaRecompilationWarning(UserWarning):
    """A step graph was compiled again because the shapes it saw changed."""


@dataclass
class _Step:
    ops: int = 0
    program: int = 0
    shapes_key: int = 0
    shapes: dict[tuple[int, ...], None] = field(default_factory=dict)


@dataclass
class StepGraphs:
    """The graphs of one process's XLA steps and what compiling them cost."""

    step: int = 0
    compiles: int = 0
    cache_hits: int = 0
    recompilations: list[str] = field(default_factory=list)
    _current: _Step = field(default_factory=_Step)
    _compiled: dict[int, set[int]] = field(default_factory=dict)
    _last_shapes: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)

    def record(self, op: Any, shapes: Iterable[tuple[int, ...]]) -> None:
        """Add ``op``, applied to tensors of ``shapes``, to the current step's graph."""
        shapes = tuple(shapes)
        current = self._current
        current.ops += 1
        current.program = hash((current.program, str(op)))
        current.shapes_key = hash((current.shapes_key, shapes))
        for shape in shapes:
            if len(current.shapes) < _SHAPES_KEPT:
                current.shapes.setdefault(shape, None)

    def mark_step(self) -> str | None:
        """End the step: run its graph, compiling it if needed; return the recompilation report line, if any."""
        finished, self._current = self._current, _Step()
        self.step += 1
        if not finished.ops:
            return None
        variants = self._compiled.setdefault(finished.program, set())
        if finished.shapes_key in variants:
            self.cache_hits += 1
            return None
        self.compiles += 1
        variants.add(finished.shapes_key)
        before = self._last_shapes.get(finished.program)
        self._last_shapes[finished.program] = list(finished.shapes)
        if before is None:
            return None
        report = _describe(self.step, len(variants), before, list(finished.shapes))
        self.recompilations.append(report)
        warnings.warn(report, XlaRecompilationWarning, stacklevel=3)
        return report

    def reset(self) -> None:
        """Forget every compiled graph and count (``torch_xla.debug.metrics.clear_all``)."""
        self.__init__()  # type: ignore[misc]


def _describe(step: int, variants: int, before: list[tuple[int, ...]], after: list[tuple[int, ...]]) -> str:
    gone = [list(shape) for shape in before if shape not in after]
    new = [list(shape) for shape in after if shape not in before]
    changed = f"shapes {_listing(gone)} became {_listing(new)}" if gone or new else "the same shapes in another order"
    return (
        f"XLA recompilation at step {step}: the step's graph ran before with other shapes ({changed}); "
        f"it has now been compiled {variants} times. Keep shapes static (pad batches to a fixed size) "
        "so that every step reuses one compiled graph."
    )


def _listing(shapes: list[list[int]]) -> str:
    return ", ".join(str(shape) for shape in shapes) or "(none)"
