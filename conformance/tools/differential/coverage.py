"""Which public functions and methods of HF accelerate the probes reach, measured, not declared.

While a probe runs under the reference, :class:`Recorder` notes every Python
function of the reference's package that is called (``sys.setprofile``).
:func:`report` matches those calls against the public callables of the
modules issue 20 names (``COVERED_MODULES``): each function, method,
property, constructor and dataclass validator (``__post_init__``) a probe reached, directly or through another public call, counts as
probed. ``python -m conformance differential --coverage`` prints the ones
no probe reaches yet.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Iterable, Iterator

#: The modules whose every public function and method the probes must reach (issue 20, item 1).
COVERED_MODULES = (
    "accelerate.accelerator", "accelerate.state", "accelerate.data_loader", "accelerate.optimizer",
    "accelerate.scheduler", "accelerate.tracking", "accelerate.logging", "accelerate.launchers",
    "accelerate.big_modeling", "accelerate.hooks", "accelerate.checkpointing", "accelerate.utils.operations",
    "accelerate.utils.modeling", "accelerate.utils.memory", "accelerate.utils.other", "accelerate.utils.random",
    "accelerate.utils.dataclasses", "accelerate",
)
CodeKey = tuple[str, int]


class Recorder:
    """A context that records ``(file, first line)`` of each function of ``module``'s package called in it.

    ``module=None`` records nothing (a run without ``--coverage``)."""

    def __init__(self, module: ModuleType | None) -> None:
        self.active = module is not None and getattr(module, "__file__", None) is not None
        self._root = str(Path(module.__file__).parent) if self.active else ""
        self.calls: set[CodeKey] = set()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(self._root):
            self.calls.add((frame.f_code.co_filename[len(self._root):], frame.f_code.co_firstlineno))

    def __enter__(self) -> "Recorder":
        if self.active:
            self._previous = sys.getprofile()
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.active:
            sys.setprofile(self._previous)


@dataclass
class Coverage:
    """Public callables per covered module, and those no probe reached."""

    total: dict[str, int]
    unprobed: dict[str, list[str]]

    def text(self) -> str:
        lines = ["public functions and methods reached by a probe (under the reference):"]
        for module, count in self.total.items():
            missing = self.unprobed[module]
            lines.append(f"  {module}: {count - len(missing)} of {count}")
            lines.extend(f"    unprobed: {name}" for name in missing)
        reached = sum(self.total.values()) - sum(map(len, self.unprobed.values()))
        lines.append(f"  total: {reached} of {sum(self.total.values())}")
        return "\n".join(lines)


def _code_key(value: Any, root: str) -> CodeKey | None:
    if isinstance(value, property):
        value = value.fget
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    value = inspect.unwrap(value) if callable(value) else value
    code = getattr(value, "__code__", None)
    if code is None or not code.co_filename.startswith(root):
        return None
    return code.co_filename[len(root):], code.co_firstlineno


def _with_constructors(names: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """The public names, and after each class the ``__init__`` and ``__post_init__`` it defines itself
    (a constructor and a dataclass's validator are public behaviour too)."""
    for name, value in names:
        yield name, value
        if inspect.isclass(value):
            for special in ("__init__", "__post_init__"):
                if special in vars(value):
                    yield f"{name}.{special}", vars(value)[special]


def report(calls: set[CodeKey]) -> Coverage:
    """Match recorded calls against the public callables of ``COVERED_MODULES``."""
    from .. import parity

    root = str(Path(importlib.import_module(parity.REFERENCE).__file__).parent)
    total: dict[str, int] = {}
    unprobed: dict[str, list[str]] = {}
    counted: set[CodeKey] = set()  # a re-export counts at its home module only (``accelerate`` comes last)
    for module_name in COVERED_MODULES:
        module = importlib.import_module(module_name)
        callables = []
        for name, value in _with_constructors(parity.public_names(module)):
            key = _code_key(value, root)
            if key is not None and key not in counted:
                counted.add(key)
                callables.append((name, key))
        total[module_name] = len(callables)
        unprobed[module_name] = [name for name, key in callables if key not in calls]
    return Coverage(total, unprobed)
