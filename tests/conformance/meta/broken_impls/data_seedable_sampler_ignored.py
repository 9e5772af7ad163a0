"""Broken: ``use_seedable_sampler=True`` is ignored; shuffles draw from the sampler's running generator.

Rule: with ``use_seedable_sampler=True`` and ``set_seed``, the order of an
epoch depends only on the seed and the epoch, so every run (and a replay
after ``set_seed`` and ``set_epoch``) gives the same batches. Caught at
world 2 by ``data.seedable_sampler``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.prepare_data_loader")


def prepare_data_loader(dataloader, *args, **kwargs):
    return original(dataloader, *args, **{**kwargs, "use_seedable_sampler": False})


ref.replace("data_loader.prepare_data_loader", prepare_data_loader)
ref.export(globals())
