"""What every dataclass of `accelerate_ref.utils.dataclasses` builds on: the field check and `KwargsHandler`.

Its own module so that the pieces in this package (the engine plugins, the
FP8 recipes) need nothing from the module that re-exports them.
"""

from __future__ import annotations

import copy
from typing import Any

from ..environment import clear_environment


def check(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition`` holds (the plugins' field validation)."""
    if not condition:
        raise ValueError(message)


class KwargsHandler:
    """Mixin for dataclasses whose non-default fields become keyword arguments.

    Catalog: kwargs.ddp, kwargs.init_process_group.
    """

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of every field."""
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose value differs from the class default.

        Rule: the defaults are those of an instance built with an empty
        environment, so defaults read from environment variables do not hide
        a value the user set explicitly.
        Catalog: kwargs.ddp, kwargs.init_process_group.
        """
        with clear_environment():
            defaults = type(self)().to_dict()
        return {key: value for key, value in self.to_dict().items() if defaults[key] != value}
