"""What a rank reports after running a target in a pool."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any


@dataclass
class RankOutcome:
    """One rank's outcome: ``value`` when ``ok``, else ``error`` (the formatted traceback).

    ``exc_types`` names the raised exception's class and its bases
    (``"module.QualName"``, most specific first), so a driver can tell an
    AssertionError from other errors without unpickling the exception.
    """

    rank: int
    ok: bool
    value: Any
    error: str | None
    exc_types: tuple[str, ...] = ()

    @classmethod
    def from_exception(cls, rank: int, exc: BaseException) -> RankOutcome:
        names = tuple(f"{klass.__module__}.{klass.__qualname__}" for klass in type(exc).__mro__[:-1])
        return cls(rank, False, None, "".join(traceback.format_exception(exc)), names)
