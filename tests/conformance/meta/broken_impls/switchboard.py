"""An implementation that delegates to another one, chosen between cases by the driver.

Only for the meta-tests: starting a rank pool costs seconds, so the
meta-tests run many broken implementations in one pool. The driver writes
the module name of the implementation to delegate to (``accelerate_ref`` or
``broken_impls.<break>``) into the file named by ``$BROKEN_IMPLS_CHOICE``
before each case; every attribute the suite reads from this module
(``Accelerator``, ``utils``, ``state``, ...) comes from that module, read at
the time of access. The worker resets the chosen implementation's state
after each case, so the next case may use another one. The implementations
named in ``$BROKEN_IMPLS_PRELOAD`` are imported when the ranks start.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

__version__ = "0.0.0+switchboard"

CHOICE_ENV = "BROKEN_IMPLS_CHOICE"
#: Comma-separated implementations to import when the ranks start (within the
#: pool's start timeout), so that no case pays for an import in its own timeout.
PRELOAD_ENV = "BROKEN_IMPLS_PRELOAD"


def chosen() -> ModuleType:
    """The implementation module the driver chose for the current case."""
    path = os.environ.get(CHOICE_ENV)
    if not path:
        raise RuntimeError(f"broken_impls.switchboard needs ${CHOICE_ENV}: a file naming the implementation to use")
    with open(path, encoding="utf-8") as handle:
        name = handle.read().strip()
    if not name or name == __name__:
        raise RuntimeError(f"broken_impls.switchboard: {path} names no implementation to delegate to ({name!r})")
    return importlib.import_module(name)


def _preload() -> None:
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        importlib.import_module(name.strip())


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    module = chosen()
    try:
        return getattr(module, name)
    except AttributeError:
        pass
    # A submodule not imported yet (``impl.part("data_loader")``).
    try:
        return importlib.import_module(f"{module.__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{module.__name__}.{name}":
            raise
        raise AttributeError(f"{module.__name__!r} (chosen by {__name__}) has no attribute {name!r}") from None


_preload()
