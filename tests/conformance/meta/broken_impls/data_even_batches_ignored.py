"""Broken: ``even_batches`` is ignored; the last step is never padded.

Rule: with ``even_batches=True`` (the default) samples from the start are
duplicated so that every rank gets the same number of full batches. Caught
at world 2 by ``data.even_batches``. (Unpadded last steps also make
``gather_for_metrics`` gather tensors of different shapes, so the meta-test
runs the ``data.*`` cases only.)
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.prepare_data_loader")


def prepare_data_loader(dataloader, *args, **kwargs):
    return original(dataloader, *args, **{**kwargs, "even_batches": False})


ref.replace("data_loader.prepare_data_loader", prepare_data_loader)
ref.export(globals())
