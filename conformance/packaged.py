"""The suite's own data files, read from the installed package (the wheel carries them: pyproject's package-data)."""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def packaged_toml(name: str) -> dict[str, Any]:
    """The TOML file ``name`` of the ``conformance`` package (``levels.toml``, ``agreement.toml``, ...)."""
    return tomllib.loads(resources.files("conformance").joinpath(name).read_text(encoding="utf-8"))
