"""Broken: the v0.27 DataLoader keywords of `Accelerator` are accepted and silently dropped (as HF 1.15 does with `split_batches`).

Rule: ``Accelerator(split_batches=..., dispatch_batches=..., even_batches=...,
use_seedable_sampler=...)`` still configures the loaders, with a deprecation
warning naming ``DataLoaderConfiguration``. Caught at world 1 by
``compat.v027_dataloader_kwargs``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
DataLoaderConfiguration = ref.get("utils.dataclasses.DataLoaderConfiguration")


def _dataloader_configuration(config, legacy):
    return config or DataLoaderConfiguration()


ref.replace("accelerator._dataloader_configuration", _dataloader_configuration)
ref.export(globals())
