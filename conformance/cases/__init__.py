"""Case modules, one per catalog area (``test_<area>.py``)."""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    """Import every case module so that its cases register themselves."""
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("test_"):
            importlib.import_module(f"{__name__}.{module.name}")
