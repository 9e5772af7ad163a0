"""Broken: `ACCELERATE_MIXED_PRECISION` wins over an explicit `mixed_precision` argument.

Rule: the variable is only the default. Caught at world 1 by
``mixed_precision.env_default`` (case ``mixed_precision_argument_wins``).
"""

import os

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state.requested_precision")


def _precision(value):
    return original(os.environ.get("ACCELERATE_MIXED_PRECISION", value))


ref.replace("state.requested_precision", _precision)
ref.export(globals())
