"""The names each documentation level lists: every identifier the seed documents of that level spell.

- ``docs-0.27``: the identifiers of the v0.27 Accelerator reference (English and Chinese), quicktour and utilities
  reference;
- ``docs-1.x``: those and the v1.x Accelerator reference's (the v1.x reference replaces the Accelerator page only).

An identifier is a run of ASCII letters, digits and underscores not starting with a digit, anywhere in the text
(code, prose, signatures): the documents spell parameters and methods inside prose as often as in code. The
suite ships the result (``conformance/documented_names.json``) so that a vendor's run needs no seed documents;
``python -m conformance.tools.documented_names SEEDS_DIR`` writes it again, and a test keeps it equal to the
seeds in ``shared/seeds``.
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path

#: The seed documents of each level, besides those of the levels below it.
LEVEL_DOCUMENTS = {
    "docs-0.27": ("accelerator_en_v0.27.txt", "accelerator_zh_v0.27.md", "quicktour_zh_v0.27.md", "utilities_zh_v0.27.md"),
    "docs-1.x": ("accelerator_zh_v1.x.txt",),
}
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*")
BUNDLED = "documented_names.json"


def extract(seeds: Path) -> dict[str, list[str]]:
    """Per level, the sorted identifiers of its documents and of the levels below it."""
    names: set[str] = set()
    found = {}
    for level, documents in LEVEL_DOCUMENTS.items():
        for document in documents:
            names |= set(IDENTIFIER.findall((seeds / document).read_text(encoding="utf-8")))
        found[level] = sorted(names)
    return found


@lru_cache(maxsize=1)
def bundled() -> dict[str, frozenset[str]]:
    """The names the suite ships, per documentation level."""
    text = resources.files("conformance").joinpath(BUNDLED).read_text(encoding="utf-8")
    return {level: frozenset(names) for level, names in json.loads(text).items()}


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1 or not Path(arguments[0]).is_dir():
        print("usage: python -m conformance.tools.documented_names SEEDS_DIR", file=sys.stderr)
        return 2
    target = Path(__file__).resolve().parents[1] / BUNDLED
    target.write_text(json.dumps(extract(Path(arguments[0])), indent=0) + "\n", encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
