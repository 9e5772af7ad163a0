"""Broken: ``skip_first_batches(dl, num_batches=n)`` skips ``n + 1`` batches.

Rule: the result yields the same batches as ``dl`` from batch ``n + 1`` on
(the third, for ``num_batches=2``). Caught at world 2 by
``data.skip_first_batches``; ``len()`` stays truthful, so
``data.len_after_prepare`` passes.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.skip_first_batches")


def skip_first_batches(dataloader, num_batches=0):
    return original(dataloader, num_batches + 1)


ref.replace("data_loader.skip_first_batches", skip_first_batches)
ref.export(globals())
