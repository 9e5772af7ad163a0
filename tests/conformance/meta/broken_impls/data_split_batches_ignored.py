"""Broken: ``split_batches=True`` is ignored; every rank gets whole batches.

Rule: with ``split_batches=True`` each step takes the script's batch size
in total, ``1/num_processes`` of each batch per rank, and a batch size that
is not a multiple of the number of processes is rejected. Caught at world 2
by ``data.split_batches``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.prepare_data_loader")


def prepare_data_loader(dataloader, *args, **kwargs):
    return original(dataloader, *args, **{**kwargs, "split_batches": False})


ref.replace("data_loader.prepare_data_loader", prepare_data_loader)
ref.export(globals())
