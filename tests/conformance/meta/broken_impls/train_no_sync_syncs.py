"""Broken: `no_sync` does nothing; gradients synchronise inside it too.

Rule: inside ``no_sync(model)`` backward passes keep gradients local.
Caught at world 2 by ``no_sync.doc_example``; the accumulation cases
(which rely on it between synchronised steps) fail too.
"""

import contextlib

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def no_sync(self, model):
    return contextlib.nullcontext()


ref.replace("accelerator.Accelerator.no_sync", no_sync)
ref.export(globals())
