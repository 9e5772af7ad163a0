"""Patching a module when it is first imported: the simulator's rules wrap torch's and libraries' functions in
the processes that use them, and a process that never imports such a module does not pay for importing it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable


def after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Call ``patch`` with module ``name`` once it is imported (now, if it already is)."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, patch))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` once the module ``name`` is imported (torch's FSDP1 costs a second to import: only
    the ranks that use it pay). A lookup alone (``importlib.util.find_spec``, how libraries ask whether a package
    is installed: transformers does for safetensors) leaves it waiting for the import."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch
        self._finding = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._finding:
            return None
        self._finding = True  # the lookup below asks the finders again, this one among them
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        loaded = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            loaded(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec
