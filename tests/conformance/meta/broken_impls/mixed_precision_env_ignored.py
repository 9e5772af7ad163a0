"""Broken: `ACCELERATE_MIXED_PRECISION` is ignored; with no argument the precision is "no".

Rule: with no ``mixed_precision`` argument the value comes from
``ACCELERATE_MIXED_PRECISION``. Caught at world 1 by
``mixed_precision.env_default`` (case ``mixed_precision_env_default``).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state.requested_precision")


def _precision(value):
    return original("no" if value is None else value)


ref.replace("state.requested_precision", _precision)
ref.export(globals())
