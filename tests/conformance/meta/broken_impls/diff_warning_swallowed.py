"""Broken: `Accelerator.autocast(cache_enabled=True)` no longer warns that the v0.27 keyword is deprecated.

Rule: a deprecated call warns as HF 1.15 does (catalog compat.autocast_cache_enabled; issue 20: warnings).
Caught by the differential harness (`tests/conformance/tools/test_differential.py`).
"""

import warnings

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _silenced(original):
    def autocast(self, *args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return original(self, *args, **kwargs)

    return autocast


ref.patch_method("accelerator.Accelerator.autocast", _silenced)
ref.export(globals())
