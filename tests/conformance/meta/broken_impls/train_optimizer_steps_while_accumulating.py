"""Broken: the prepared optimizer steps on every call, synchronised or not.

Rule: while gradients accumulate (``sync_gradients`` False) ``optimizer.step()``
does nothing; weights change once per accumulation cycle. Caught at world 2
by ``accumulate.doc_example``, ``accumulate.plugin`` and
``accumulate.end_of_dataloader``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def step(self, closure=None):
    return self.optimizer.step(closure)


ref.replace("optimizer.AcceleratedOptimizer.step", step)
ref.export(globals())
