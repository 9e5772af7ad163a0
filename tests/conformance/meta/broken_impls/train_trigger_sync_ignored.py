"""Broken: `trigger_sync_in_backward` does nothing.

Rule: the backward inside ``trigger_sync_in_backward(model)`` synchronises
gradients even of forwards run under ``no_sync``. Caught at world 2 by
``no_sync.trigger_sync_in_backward``.
"""

import contextlib

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def trigger_sync_in_backward(model):
    return contextlib.nullcontext()


ref.replace("accelerator.Accelerator.trigger_sync_in_backward", staticmethod(trigger_sync_in_backward))
ref.export(globals())
