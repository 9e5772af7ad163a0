"""Broken: `ACCELERATE_DEBUG_MODE=1` is ignored: collectives never compare shapes across ranks first.

Rule: in debug mode, a gather/reduce/broadcast whose shapes differ across
ranks raises on every rank an error naming each rank's shape. Without the
check, gloo gets mismatched buffers (an error that names no shapes, garbage,
or a hang). Caught at world 2 by ``debug.shape_mismatch``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _verify(data, operation, state, collectives):
    """Debug mode's check across ranks, skipped."""


ref.replace("utils.operations._verify", _verify)
ref.export(globals())
