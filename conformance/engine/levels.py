"""Conformance levels: which source a case's rule rests on, and which cases a run at a level runs.

The levels, lowest first (``shared/DESIGN.md``, "Conformance levels"):

- ``docs-0.27``: the v0.27 documents (the Accelerator reference, the quicktour, the utilities reference);
- ``docs-1.x``: the v1.x Accelerator reference (with the v0.27 utilities it does not replace);
- ``hf-1.15``: HF accelerate 1.15's behaviour, where the documents are silent.

A run at a level runs the cases of that level and the ones below it; a case above it is "beyond level", counted
apart and never run. Every case has a level: its own (``@case(..., level=...)``, or ``levels.toml``'s ``[cases]``),
else its catalog row's (``levels.toml``'s ``[rows]``), else ``docs-0.27``. The ranks read the run's level from ``$ACCELERATE_CONFORMANCE_LEVEL``
(:func:`current`), so that a case spells the API as its level does (``conformance.support.spellings``).
"""

from __future__ import annotations

import os
from functools import lru_cache

from ..packaged import packaged_toml

LEVELS = ("docs-0.27", "docs-1.x", "hf-1.15")
DEFAULT_LEVEL = "hf-1.15"
#: The level of a run, as its driver and its ranks read it.
LEVEL_ENV = "ACCELERATE_CONFORMANCE_LEVEL"


def parse(text: str) -> str:
    """``text`` as a level; ValueError (one line) naming the levels when it is none."""
    if text not in LEVELS:
        raise ValueError(f"unknown conformance level {text!r}: choose one of {', '.join(LEVELS)}")
    return text


def current() -> str:
    """The level of the run this process serves (``$ACCELERATE_CONFORMANCE_LEVEL``, else the default)."""
    return parse(os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL)


def within(case_level: str, level: str) -> bool:
    """Whether a case of ``case_level`` runs at a run of ``level``."""
    return LEVELS.index(case_level) <= LEVELS.index(level)


@lru_cache(maxsize=1)
def _table() -> dict:
    return packaged_toml("levels.toml")


def of_case(catalog_id: str, key: str) -> str:
    """The level of case ``key`` (``module:function``) of catalog row ``catalog_id``: its own in ``levels.toml``'s
    ``[cases]``, else its row's (``[rows]``), else docs-0.27."""
    table = _table()
    rows = {row: level for level, ids in table["rows"].items() for row in ids}
    return parse(table["cases"].get(key) or rows.get(catalog_id) or LEVELS[0])
