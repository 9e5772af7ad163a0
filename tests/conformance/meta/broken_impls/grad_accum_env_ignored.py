"""Broken: `ACCELERATE_GRADIENT_ACCUMULATION_STEPS` is ignored by `Accelerator()`.

Rule: with no argument, ``gradient_accumulation_steps`` comes from
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``. Caught at world 1 by
``mixed_precision.env_default`` (case ``mixed_precision_env_default``).
"""

import os
from unittest import mock

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _ignore_variable(original):
    def __init__(self, *args, **kwargs):
        with mock.patch.dict(os.environ):
            os.environ.pop("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", None)
            original(self, *args, **kwargs)

    return __init__


ref.patch_method("accelerator.Accelerator.__init__", _ignore_variable)
ref.export(globals())
