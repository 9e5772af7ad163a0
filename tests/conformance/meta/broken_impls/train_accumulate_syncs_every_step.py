"""Broken: `accumulate` synchronises gradients on every step.

Rule: with ``gradient_accumulation_steps=2`` gradients synchronise (and the
prepared optimizer steps) only on every 2nd batch. Caught at world 2 by
``accumulate.doc_example``, ``accumulate.plugin``,
``accumulate.end_of_dataloader`` and ``accumulate.scheduler``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _count_step(self):
    self.step += 1
    self.gradient_state._set_sync_gradients(True)


ref.replace("accelerator.Accelerator._count_step", _count_step)
ref.export(globals())
