"""Broken: ``gather_for_metrics`` gathers like ``gather`` and keeps the duplicated samples.

Rule: on the last batch of a prepared loader ``gather_for_metrics`` drops
the samples ``even_batches`` duplicated (``DataLoader(range(9),
batch_size=5)`` on 2 ranks gathers 9 items, not 10). Caught at world 2 by
``gather_for_metrics.doc_example``, ``gather_for_metrics.tuple``,
``gather_for_metrics.use_gather_object`` and ``gather_for_metrics.full_epoch``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
operations = ref.module("utils.operations")


def gather_for_metrics(self, input_data, use_gather_object=False):
    if use_gather_object:
        return operations.gather_object(input_data)
    return operations.gather(input_data)


ref.replace("accelerator.Accelerator.gather_for_metrics", gather_for_metrics)
ref.export(globals())
