"""Broken: `backward` does not divide the loss by the accumulation steps.

Rule: ``accelerator.backward(loss)`` with ``gradient_accumulation_steps=2``
gives the gradients of ``loss / 2``, so accumulating 2 batches equals one
batch twice as big. Caught at world 2 by ``backward.loss``
(``backward_loss_scaled_under_accumulation``) and by the accumulation cases
(``accumulate.doc_example``, ``accumulate.plugin``,
``accumulate.end_of_dataloader``), whose gradients no longer match the replay.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def backward(self, loss, **kwargs):
    self._precision.scale_loss(loss).backward(**kwargs)


ref.replace("accelerator.Accelerator.backward", backward)
ref.export(globals())
