"""Broken: a loader's ``remainder`` is the number of padding samples, not of real ones.

Rule: on the last batch ``gather_for_metrics`` keeps the real samples of
the last global batch (``remainder`` of them) and drops what
``even_batches`` duplicated. Counting the padding instead (the docstring of
HF's GradientState invites that reading) keeps 1 of the 9 items of the
documented example. Caught at world 2 by ``gather_for_metrics.doc_example``,
``gather_for_metrics.tuple``, ``gather_for_metrics.use_gather_object`` and
``gather_for_metrics.full_epoch``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.DataLoaderStateMixin.begin")


def begin(self):
    original(self)
    if self.remainder > 0:
        self.remainder = self.total_batch_size - self.remainder


ref.replace("data_loader.DataLoaderStateMixin.begin", begin)
ref.export(globals())
