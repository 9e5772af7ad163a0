"""Catalog section "Compatibility across documented versions" (A v0.27, A v1.x).

What a script written against the v0.27 documents still does on an
implementation of v1.x: the ``Accelerator`` keywords that v1.x moved into
`DataLoaderConfiguration`, and ``autocast(cache_enabled=True)``, which v1.x
spells ``autocast(autocast_handler=AutocastKwargs(cache_enabled=True))``.
The loaders' behaviour under each setting is checked by the ``data.*``
cases through `DataLoaderConfiguration`; here the old spelling must reach
that same configuration.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch.utils.data import DataLoader

from ..engine.case import case
from ..support.checks import expect_equal, expect_true, plain

#: Each v0.27 keyword with a value other than its default (accelerator_en_v0.27, `Accelerator`).
V027_DATALOADER_KEYWORDS = {
    "split_batches": True,
    "dispatch_batches": True,
    "even_batches": False,
    "use_seedable_sampler": True,
}


@case("compat.v027_dataloader_kwargs", worlds=[1])
def v027_dataloader_kwargs(impl, world):
    """``Accelerator(split_batches=..., dispatch_batches=..., even_batches=..., use_seedable_sampler=...)`` still
    configures the prepared loaders, with a deprecation warning (DeprecationWarning or FutureWarning) that names
    ``DataLoaderConfiguration``; the setting shows in ``accelerator.dataloader_config`` (v1.x's home for it) and
    a loader prepared under it still yields the whole dataset.
    """
    for keyword, value in V027_DATALOADER_KEYWORDS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            acc = impl.Accelerator(**{keyword: value})
        named = [
            warning
            for warning in caught
            if issubclass(warning.category, (DeprecationWarning, FutureWarning))
            and "DataLoaderConfiguration" in str(warning.message)
        ]
        expect_true(bool(named), f"Accelerator({keyword}={value}) warns of its deprecation naming DataLoaderConfiguration")
        expect_equal([os.path.basename(warning.filename) for warning in named], [os.path.basename(__file__)],
                     f"the file the deprecation warning of Accelerator({keyword}={value}) names (the caller's, where "
                     "the keyword is to be changed)")
        expect_equal(getattr(acc.dataloader_config, keyword), value, f"dataloader_config.{keyword} after Accelerator({keyword}={value})")
        batches = [plain(batch) for batch in acc.prepare(DataLoader(range(6), batch_size=2))]
        expect_equal(sorted(sample for batch in batches for sample in batch), list(range(6)),
                     f"samples of a loader prepared by Accelerator({keyword}={value})")


@case("compat.autocast_cache_enabled", worlds=[1])
def autocast_cache_enabled(impl, world):
    """Under ``mixed_precision="bf16"``, v0.27's ``autocast(cache_enabled=True)`` and v1.x's
    ``autocast(autocast_handler=AutocastKwargs(cache_enabled=True))`` both enter autocast with torch's
    autocast cache on (turned off outside first, so that only the keyword can turn it on).
    """
    acc = impl.Accelerator(mixed_precision="bf16")
    spellings = {
        "autocast(autocast_handler=AutocastKwargs(cache_enabled=True))":
            lambda: acc.autocast(autocast_handler=impl.utils.AutocastKwargs(cache_enabled=True)),
        "autocast(cache_enabled=True)": lambda: acc.autocast(cache_enabled=True),
    }
    outside = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        for spelling, enter in spellings.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # the old spelling may warn of its deprecation
                with enter():
                    inside = (torch.is_autocast_enabled(acc.device.type), torch.is_autocast_cache_enabled())
            expect_equal(inside, (True, True), f"(autocast enabled, autocast cache enabled) inside accelerator.{spelling}")
    finally:
        torch.set_autocast_cache_enabled(outside)
