"""Package attributes that import their module on first use (PEP 562).

A package's ``__init__`` lists what it re-exports and from where; nothing is
imported until a name is asked for, so ``accelerate-ref launch`` (which needs
``accelerate_ref.commands`` only) does not pay for the Accelerator, FSDP and
the rest at start-up (issue 11's start-up goal). ``from pkg import name``,
``pkg.name``, ``dir(pkg)`` and ``from pkg import *`` behave as with eager
imports, and so does ``pkg.submodule`` for a submodule nobody imported yet.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable


def lazy_exports(
    module: str, namespace: dict[str, Any], exports: dict[str, tuple[str, str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``module`` (its globals are ``namespace``): ``exports``
    maps a public name to (module relative to the package, attribute there); a loaded value is
    kept in ``namespace``. A package also gives its submodules by name."""
    anchor = namespace["__package__"]
    is_package = "__path__" in namespace

    def __getattr__(name: str) -> Any:
        if name in exports:
            source, attribute = exports[name]
            value = getattr(importlib.import_module(source, anchor), attribute)
        elif is_package and not name.startswith("__") and importlib.util.find_spec(f"{module}.{name}") is not None:
            value = importlib.import_module(f"{module}.{name}")
        else:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
