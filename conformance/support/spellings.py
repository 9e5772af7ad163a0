"""The API spelled as the run's conformance level spells it (``conformance/engine/levels.py``).

Where two levels spell one behaviour differently, a case asks here and states the rule once; the run's level
(``$ACCELERATE_CONFORMANCE_LEVEL`` in the ranks) picks the spelling, so the rule is checked in both:

- the data-loader options ``split_batches``, ``dispatch_batches``, ``even_batches`` and ``use_seedable_sampler``
  are ``Accelerator`` keywords in the v0.27 reference (seeds/accelerator_en_v0.27.txt, the signature of
  ``Accelerator``) and fields of ``DataLoaderConfiguration``, passed as ``Accelerator(dataloader_config=...)``, in
  the v1.x reference (seeds/accelerator_zh_v1.x.txt);
- a config file as ``accelerate config`` writes it has the keys of its release: ``enable_cpu_affinity`` came with
  accelerate 0.29 (``accelerate/commands/config/config_args.py``), after the v0.27 documents, whose release
  refuses a file with a key it does not know.
"""

from __future__ import annotations

import json
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


#: Config-file keys newer than the v0.27 documents' release (accelerate 0.27.2 refuses unknown keys).
POST_V027_CONFIG_KEYS = ("enable_cpu_affinity",)


def config_file(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` of a config file, with the keys the run's level does not have left out."""
    if levels.current() != levels.LEVELS[0]:
        return dict(values)
    return {key: value for key, value in values.items() if key not in POST_V027_CONFIG_KEYS}


def config_text(text: str) -> str:
    """A config file written as JSON (which is YAML), with the keys the run's level does not have left out."""
    return json.dumps(config_file(json.loads(text)), indent=2) + "\n"
