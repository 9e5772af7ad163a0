"""Broken: `Accelerator.autocast(cache_enabled=True)` is accepted and ignored.

Rule: v0.27's ``autocast(cache_enabled=True)`` turns torch's autocast cache
on for the block, as v1.x's ``AutocastKwargs(cache_enabled=True)`` does.
Caught at world 1 by ``compat.autocast_cache_enabled``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def autocast(self, autocast_handler=None, cache_enabled=False):
    return self._precision.autocast(None if isinstance(autocast_handler, bool) else autocast_handler)


ref.replace("accelerator.Accelerator.autocast", autocast)
ref.export(globals())
