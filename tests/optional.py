"""Skip markers for the optional packages some tests need (each installed by an extra)."""

from __future__ import annotations

import importlib.util

import pytest

from accelerate_ref.utils import is_torchdata_stateful_dataloader_available

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (extra ao)")
needs_torchdata = pytest.mark.skipif(not is_torchdata_stateful_dataloader_available(), reason="torchdata is not installed")
