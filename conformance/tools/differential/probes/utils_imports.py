"""Probes of ``accelerate.utils.imports`` names exported at the top level: ``is_rich_available``."""

from __future__ import annotations

import os

from ..probe import Api, probe


@probe("utils.imports")
def is_rich_available(api: Api) -> None:
    api.call("by default", "is_rich_available")
    os.environ["ACCELERATE_ENABLE_RICH"] = "1"
    api.call("with ACCELERATE_ENABLE_RICH=1", "is_rich_available")
    api.call("from utils", "utils.is_rich_available")
