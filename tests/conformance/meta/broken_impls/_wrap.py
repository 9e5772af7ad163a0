"""Building a broken implementation: a private copy of `accelerate_ref` with one piece replaced.

A broken module does::

    from broken_impls._wrap import BrokenCopy

    ref = BrokenCopy(__name__)
    original = ref.get("utils.operations.reduce")

    def reduce(tensor, reduction="mean", scale=1.0):
        return original(tensor, "sum" if reduction == "mean" else reduction, scale)

    ref.replace("utils.operations.reduce", reduce)
    ref.export(globals())

Why a copy: the suite imports the broken module in the driver too (for its
version), and patching the real `accelerate_ref` there would break every
other test in the same process. The copy is the reference package loaded a
second time under the name ``_accelerate_ref_for_<module>`` (its imports are
all relative, so it never touches the real one), registered in
``sys.modules`` so that objects it defines pickle between ranks and driver.

`replace` rebinds a name in every module of the copy that holds the same
object, so ``Accelerator.reduce`` (which calls ``operations.reduce``) and
``utils.reduce`` (the re-export) both break together, as they would in a
real implementation with this bug.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable

#: Version reported by every broken implementation (the suite's run header shows it).
VERSION = "0.0.0+broken"


class BrokenCopy:
    """A private copy of `accelerate_ref` for the broken module called ``owner``."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.name = "_accelerate_ref_for_" + owner.replace(".", "_")
        self.root = _load_copy(self.name)

    def module(self, dotted: str = "") -> ModuleType:
        """The copy's submodule ``dotted`` (``"utils.operations"``), imported if needed."""
        return importlib.import_module(f"{self.name}.{dotted}" if dotted else self.name)

    def get(self, dotted: str) -> Any:
        """The object at ``dotted`` (``"state.PartialState.print"``), starting from a submodule."""
        owner, attribute = self._owner_of(dotted)
        return getattr(owner, attribute)

    def replace(self, dotted: str, new: Any, everywhere: bool = True) -> Any:
        """Put ``new`` at ``dotted`` and wherever the copy bound the old object by name; return the old one.

        ``"state.PartialState.print"`` replaces a class attribute (a method or
        property) of the copy's class; ``"utils.operations.reduce"`` a module
        global, rebound also in ``utils`` and every other loaded module of the
        copy (``from .operations import reduce`` made a second binding), unless
        ``everywhere`` is false.
        """
        owner, attribute = self._owner_of(dotted)
        old = getattr(owner, attribute)
        if isinstance(owner, ModuleType) and everywhere:
            for module, key in self._bindings(old):
                setattr(module, key, new)
        else:
            setattr(owner, attribute, new)
        return old

    def remove(self, dotted: str) -> Any:
        """Delete the module global at ``dotted`` and every other binding of it in the copy; return it."""
        owner, attribute = self._owner_of(dotted)
        old = getattr(owner, attribute)
        for module, key in self._bindings(old):
            delattr(module, key)
        return old

    def patch_method(self, dotted: str, make: Callable[[Any], Any]) -> None:
        """Replace the method at ``dotted`` by ``make(original)``."""
        self.replace(dotted, make(self.get(dotted)))

    def export(self, namespace: dict[str, Any]) -> None:
        """Make ``namespace`` (a broken module's globals) look like the implementation package.

        The suite reaches ``impl.Accelerator``, ``impl.utils``, ``impl.state``
        and the other public names as attributes of the module.
        """
        root = self.root
        for key in dir(root):
            if not key.startswith("__"):
                namespace.setdefault(key, getattr(root, key))
        for sub in ("utils", "state", "accelerator"):
            namespace.setdefault(sub, self.module(sub))
        namespace["__version__"] = VERSION
        namespace["_copy"] = self

        def __getattr__(name: str) -> Any:
            # A submodule of the copy not imported yet (``impl.part("data_loader")``).
            if name.startswith("__"):
                raise AttributeError(name)
            try:
                return self.module(name)
            except ModuleNotFoundError as error:
                if error.name != f"{self.name}.{name}":
                    raise  # the submodule exists but needs something missing
                raise AttributeError(f"module {self.owner!r} has no attribute {name!r}") from None

        namespace["__getattr__"] = __getattr__

    # -- internals ---------------------------------------------------------

    def _bindings(self, obj: Any) -> list[tuple[ModuleType, str]]:
        """Every (module, name) of the copy whose global is ``obj``."""
        return [(m, key) for m in self._modules() for key, value in list(vars(m).items()) if value is obj]

    def _modules(self) -> list[ModuleType]:
        prefix = self.name + "."
        return [m for key, m in list(sys.modules.items()) if m is not None and (key == self.name or key.startswith(prefix))]

    def _owner_of(self, dotted: str) -> tuple[Any, str]:
        """The object holding the last part of ``dotted``, resolving the longest module prefix first."""
        parts = dotted.split(".")
        for split in range(len(parts) - 1, -1, -1):
            try:
                owner: Any = self.module(".".join(parts[:split]))
            except ModuleNotFoundError:
                continue
            for part in parts[split:-1]:
                owner = getattr(owner, part)
            if not hasattr(owner, parts[-1]):
                raise AttributeError(f"{self.owner}: the reference has no {dotted!r} to break")
            return owner, parts[-1]
        raise AttributeError(f"{self.owner}: cannot resolve {dotted!r}")  # pragma: no cover


def _load_copy(name: str) -> ModuleType:
    """Load `accelerate_ref` a second time as package ``name`` (once per process)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("accelerate_ref")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("broken_impls needs the accelerate_ref package to copy")
    locations = list(spec.submodule_search_locations)
    copy_spec = importlib.util.spec_from_file_location(name, spec.origin, submodule_search_locations=locations)
    assert copy_spec is not None and copy_spec.loader is not None
    module = importlib.util.module_from_spec(copy_spec)
    sys.modules[name] = module
    try:
        copy_spec.loader.exec_module(module)
        # The package loads its re-exports on first use; a copy loads them all now, so that
        # `replace` and `remove` find every binding a module of the copy will ever hold.
        for package in (module, importlib.import_module(f"{name}.utils")):
            for key in package._EXPORTS:
                getattr(package, key)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
