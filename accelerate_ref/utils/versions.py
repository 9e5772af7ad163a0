"""Version comparisons of installed libraries.

Catalog: env.checks. Reads package metadata only; imports no library.
"""

from __future__ import annotations

import importlib.metadata
from typing import Union

from packaging.version import Version, parse

from .constants import STR_OPERATION_TO_FUNC

#: The installed torch's version, read from its metadata once, at import (HF 1.15:
#: accelerate/utils/versions.py ``torch_version``): torch cannot change under a process that has imported it.
torch_version = parse(importlib.metadata.version("torch"))


def compare_versions(library_or_version: Union[str, Version], operation: str, requirement_version: str) -> bool:
    """Compare a library's installed version (or a `Version`) with a requirement.

    Rule: `operation` is one of ">", ">=", "==", "!=", "<=", "<" (anything
    else is a ValueError naming it); a string is a distribution name whose
    installed version is read from its metadata (not installed:
    `importlib.metadata.PackageNotFoundError`).
    Catalog: env.checks.
    """
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"operation must be one of {list(STR_OPERATION_TO_FUNC)}, got {operation!r}")
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """Compare the installed torch version with `version`, e.g. `is_torch_version(">=", "2.0")`.

    Rule: as `compare_versions(torch_version, operation, version)`: the version read at import, without
    importing torch.
    Catalog: env.checks.
    """
    return compare_versions(torch_version, operation, version)
