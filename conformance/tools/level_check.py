"""The level tags checked: every API name a case reaches through the implementation is one its level's documents list.

The names a case reaches are read from its source (and from the functions of its own module it calls, as far as
they go), without running it:

- every attribute of a chain rooted at the implementation, ``impl.utils.DataLoaderConfiguration`` or
  ``impl.part("big_modeling").init_empty_weights``, or at a variable bound to such a chain
  (``big_modeling = impl.part("big_modeling")``) (the ``Implementation`` wrapper's own ``part``, ``name``,
  ``version`` and ``reset`` are the suite's, not the API's; module names and Python's dunders are not API names);
- every keyword of a call of such a chain (``impl.Accelerator(dataloader_config=...)``);
- on a variable bound to an Accelerator (``acc = impl.Accelerator(...)``, or the result of a helper whose name
  says ``accelerator``), each attribute read and each keyword of a method call but those a documented
  ``**kwargs`` passes on to torch (``PASSED_ON``).

Functions of other modules (``conformance.support``) are not followed: ``conformance.support.spellings`` spells
the API as the run's level does, and the shared helpers are checked where they are written. A case of ``hf-1.15``
is not checked (HF's behaviour is its source); one of ``docs-0.27`` or ``docs-1.x`` passes when every name it
reaches is in :func:`conformance.tools.documented_names.bundled` for its level.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from functools import lru_cache
from typing import Any

from ..engine.case import Case
from .documented_names import bundled

#: The ``Implementation`` wrapper's own attributes (conformance/engine/impl.py).
WRAPPER_ATTRIBUTES = frozenset({"part", "name", "version", "reset", "module"})
#: Names of variables that hold an Accelerator in the cases, besides those bound to one by a call.
ACCELERATOR_VARIABLES = frozenset({"acc", "accelerator"})
#: Keywords the documents' ``**kwargs`` hand to torch: ``backward(loss, **kwargs)`` passes them to
#: ``loss.backward`` (seeds/accelerator_en_v0.27.txt, ``backward``).
PASSED_ON = frozenset({"retain_graph", "create_graph", "inputs"})
#: Documented callables whose ``**kwargs`` are not API names: ``patch_environment(**kwargs)`` takes environment
#: variables, ``recursively_apply(func, data, *args, **kwargs)`` hands them to ``func`` (seeds/utilities_zh_v0.27.md).
FREE_KEYWORDS = frozenset({"patch_environment", "recursively_apply"})


def reached_names(case: Case) -> set[str]:
    """The API names ``case`` reaches through the implementation (module docstring)."""
    module = sys.modules[case.function.__module__]
    seen: set[str] = set()
    names: set[str] = set()
    pending: list[Any] = [case.function]
    while pending:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        tree = _tree(function)
        names |= {name for name in _Reader(module).read(tree) if not name.startswith("__")}
        called = (getattr(module, node.func.id, None) for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name))
        pending += [helper for helper in called if inspect.isfunction(helper) and helper.__module__ == module.__name__]
    return names


def undocumented(case: Case) -> set[str]:
    """The names ``case`` reaches that its level's documents do not list (none for an ``hf-1.15`` case)."""
    documented = bundled().get(case.level)
    return set() if documented is None else reached_names(case) - documented


def lowest_level(case: Case) -> str:
    """The lowest documentation level whose documents list every name ``case`` reaches, else ``hf-1.15``."""
    reached = reached_names(case)
    return next((level for level, names in bundled().items() if reached <= names), "hf-1.15")


@lru_cache(maxsize=1)
def _modules() -> frozenset[str]:
    """The module names of the API (``accelerate_ref``'s, which mirrors HF's module for module)."""
    import pkgutil

    import accelerate_ref

    return frozenset(name.rpartition(".")[2] for _, name, _ in pkgutil.walk_packages(accelerate_ref.__path__, "accelerate_ref."))


def _tree(function: Any) -> ast.AST:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError):
        return ast.Module(body=[], type_ignores=[])


class _Reader(ast.NodeVisitor):
    """Collects the names of one function (module docstring)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.names: set[str] = set()
        self.roots: set[str] = {"impl"}
        self.accelerators: set[str] = set(ACCELERATOR_VARIABLES)

    def read(self, tree: ast.AST) -> set[str]:
        for node in ast.walk(tree):  # bindings first: a use may precede its binding in walk order
            if not isinstance(node, ast.Assign):
                continue
            targets = {target.id for target in node.targets if isinstance(target, ast.Name)}
            if isinstance(node.value, ast.Call) and self._makes_accelerator(node.value):
                self.accelerators |= targets
            elif isinstance(node.value, ast.Attribute | ast.Call) and _chain(node.value)[:1] == ["impl"]:
                self.roots |= targets  # ``modeling = impl.utils.modeling``: its attributes are the API's too
            elif isinstance(node.value, ast.Call) and _returns_part(self.module, node.value):
                self.roots |= targets  # ``modeling = _modeling(impl)``, a helper returning such a chain
        self.visit(tree)
        return self.names

    def _makes_accelerator(self, call: ast.Call) -> bool:
        chain = _chain(call.func)
        return bool(chain) and (chain[-1] == "Accelerator" and chain[0] in self.roots or "accelerator" in chain[-1].lower())

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        chain = _chain(node)
        if chain and chain[0] in self.roots:
            self.names |= {name for name in chain[1:] if name not in WRAPPER_ATTRIBUTES and name not in _modules()}
        elif chain and chain[0] in self.accelerators:
            self.names.add(chain[1])
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        chain = _chain(node.func)
        if chain and chain[0] in self.roots and chain[-1] not in FREE_KEYWORDS:
            self.names |= {keyword.arg for keyword in node.keywords if keyword.arg}
        elif chain and chain[0] in self.accelerators and len(chain) > 1:
            self.names |= {keyword.arg for keyword in node.keywords if keyword.arg and keyword.arg not in PASSED_ON}
        self.generic_visit(node)


def _returns_part(module: Any, call: ast.Call) -> bool:
    """Whether ``call`` calls a function of ``module`` that returns a chain rooted at the implementation."""
    helper = getattr(module, call.func.id, None) if isinstance(call.func, ast.Name) else None
    if not inspect.isfunction(helper):
        return False
    returned = (node.value for node in ast.walk(_tree(helper)) if isinstance(node, ast.Return) and node.value is not None)
    return any(_chain(value)[:1] == ["impl"] for value in returned)


def _chain(node: ast.AST) -> list[str]:
    """``["impl", "utils", "x"]`` for ``impl.utils.x``; through a call: ``impl.part("m").f`` is ``["impl", "part", "f"]``."""
    names: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            return [node.id, *reversed(names)]
        else:
            return []
