"""Broken: the deprecation warning of the v0.27 DataLoader keywords names a line inside the implementation.

Rule (compat.v027_dataloader_kwargs): ``Accelerator(split_batches=...)`` warns naming ``DataLoaderConfiguration``,
and the warning points at the caller's line (its ``stacklevel``), where the keyword is to be changed. Here it
is raised again one frame too deep, as a mutant of the stacklevel did (issue 24). Caught at world 1.
"""

import warnings

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("accelerator._dataloader_configuration")


def _dataloader_configuration(config, legacy):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configuration = original(config, legacy)
    for warning in caught:
        warnings.warn(warning.message, warning.category, stacklevel=1)
    return configuration


ref.replace("accelerator._dataloader_configuration", _dataloader_configuration)
ref.export(globals())
