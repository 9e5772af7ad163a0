"""The catalog of documented behaviour, shipped with the suite.

`catalog.md` is a copy of the project's ``shared/CATALOG.md`` (a test keeps
the two equal). Each table row is one :class:`Entry`; the section it sits in
is the area the run summary groups results by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

_SECTION = re.compile(r"^## (?P<title>.+?)(?: \((?P<sources>[^)]*)\))?$")
_ROW = re.compile(r"^\| (?P<id>[a-z0-9_.]+) \| (?P<world>[^|]*) \| (?P<text>.*) \|$")


@dataclass(frozen=True)
class Entry:
    """One documented example or rule."""

    id: str
    area: str
    world: str
    text: str


def parse(markdown: str) -> list[Entry]:
    """One entry per catalog ID of ``markdown``, in document order.

    An ID that a later section repeats (``config.write_basic_config`` sits in
    both "Utilities" and "Launching") is one entry, in the place and with the
    text of its last row, which restates the rule most fully.
    """
    entries: dict[str, Entry] = {}
    area = ""
    for line in markdown.splitlines():
        if section := _SECTION.match(line):
            area = section["title"].strip()
        elif (row := _ROW.match(line)) and area:
            entries.pop(row["id"], None)
            entries[row["id"]] = Entry(row["id"], area, row["world"].strip(), row["text"].strip())
    return list(entries.values())


@lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    """The packaged catalog."""
    return tuple(parse(resources.files(__package__).joinpath("catalog.md").read_text(encoding="utf-8")))


def by_id() -> dict[str, Entry]:
    return {entry.id: entry for entry in entries()}


def area_of(catalog_id: str) -> str:
    """The catalog section an ID belongs to, or ``"Uncatalogued"``."""
    entry = by_id().get(catalog_id)
    return entry.area if entry else "Uncatalogued"
