"""The API spelled as the run's conformance level spells it (``conformance/engine/levels.py``).

Where two levels spell one behaviour differently, a case asks here and states the rule once; the run's level
(``$ACCELERATE_CONFORMANCE_LEVEL`` in the ranks) picks the spelling, so the rule is checked in both:

- the data-loader options ``split_batches``, ``dispatch_batches``, ``even_batches`` and ``use_seedable_sampler``
  are ``Accelerator`` keywords in the v0.27 reference (seeds/accelerator_en_v0.27.txt, the signature of
  ``Accelerator``) and fields of ``DataLoaderConfiguration``, passed as ``Accelerator(dataloader_config=...)``, in
  the v1.x reference (seeds/accelerator_zh_v1.x.txt).
"""

from __future__ import annotations

from typing import Any

from ..engine import levels

#: The data-loader options the v0.27 reference takes as ``Accelerator`` keywords.
V027_DATALOADER_KEYWORDS = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler")


def accelerator(impl: Any, dataloader: dict[str, Any] | None = None, **options: Any) -> Any:
    """``impl.Accelerator(**options)`` whose prepared loaders take the data-loader options ``dataloader``: as
    ``Accelerator`` keywords at docs-0.27, through ``DataLoaderConfiguration`` above it."""
    if not dataloader:
        return impl.Accelerator(**options)
    if levels.current() == levels.LEVELS[0] and set(dataloader) <= set(V027_DATALOADER_KEYWORDS):
        return impl.Accelerator(**dataloader, **options)
    return impl.Accelerator(dataloader_config=impl.utils.DataLoaderConfiguration(**dataloader), **options)
