"""Imported by the fork server of the differential's ranks, after both implementations (the rank pool's
``preload``, :func:`.runner._on_ranks`): the part of every rank's :func:`.rank.setup` that reads nothing of the
rank, done once before the ranks fork, so that each rank inherits it instead of repeating it.

- HF accelerate's documented modules walked for their public classes (:meth:`.observe.ClassIndex.of_public_api`,
  cached): every command and utility module of both packages imported;
- DeepSpeed's accelerator module imported (where DeepSpeed is installed); the rank still picks the accelerator
  itself, quietly (:func:`.rank.deepspeed_accelerator_quietly`), since DeepSpeed decides it from the process.

Before this, these two took 29 of the differential command's 78 CPU-s, all in its ranks' setups (py-spy over the
whole command, 2-core VM, 2026-11-30).
"""

from __future__ import annotations

import importlib
import importlib.util

from .observe import ClassIndex

ClassIndex.of_public_api()
if importlib.util.find_spec("deepspeed") is not None:
    importlib.import_module("deepspeed.accelerator")
