"""The implementation under test, reached by module name only.

The suite never imports an implementation's internals by path: it imports
the module named by ``--impl`` / ``ACCELERATE_IMPL`` and reaches ``utils``
and ``state`` as attributes or submodules of it, so a single-file wrapper
module (as the meta-tests' broken implementations are) works as well as a
package.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

ENV_VAR = "ACCELERATE_IMPL"
DEFAULT = "accelerate_ref"


def chosen(name: str | None = None) -> str:
    """The implementation's module name: the argument, else ``ACCELERATE_IMPL``, else the reference."""
    return name or os.environ.get(ENV_VAR) or DEFAULT


@dataclass
class Implementation:
    """An imported implementation module with the parts the cases use."""

    module: ModuleType

    @classmethod
    def load(cls, name: str) -> "Implementation":
        try:
            return cls(importlib.import_module(name))
        except ImportError as error:
            raise ImportError(f"cannot import the implementation under test {name!r}: {error}") from error

    @property
    def name(self) -> str:
        return self.module.__name__

    def part(self, attribute: str) -> Any:
        """``module.<attribute>``, importing ``<name>.<attribute>`` if needed."""
        found = getattr(self.module, attribute, None)
        if found is None:
            found = importlib.import_module(f"{self.name}.{attribute}")
        return found

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return self.part(attribute)

    @property
    def version(self) -> str:
        """The module's ``__version__``, else its distribution's version, else ``"unknown"``."""
        found = getattr(self.module, "__version__", None)
        if found:
            return str(found)
        top = self.name.split(".")[0]
        for dist in metadata.packages_distributions().get(top, []):
            return metadata.version(dist)
        return "unknown"

    def reset(self) -> None:
        """Forget the implementation's process-wide state, keeping the process group.

        Uses the documented ``_reset_state`` hooks that HF accelerate's own
        tests use; an implementation without them keeps its state.
        """
        state = self.part("state")
        accelerator_state = getattr(state, "AcceleratorState", None)
        if accelerator_state is not None and hasattr(accelerator_state, "_reset_state"):
            accelerator_state._reset_state(True)
        gradient_state = getattr(state, "GradientState", None)
        if gradient_state is not None and hasattr(gradient_state, "_reset_state"):
            gradient_state._reset_state()
