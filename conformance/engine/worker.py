"""What runs inside each rank: import the implementation, run cases, reset state.

The driver reaches these functions through the simulator's rank pool (or
calls them directly on the native backend). Each case's outcome is returned
as plain data over the pool's control channel, never through the process
group under test.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any
from unittest import mock

from .case import NotSupported, WorldInfo, find
from .impl import Implementation, chosen
from .results import Status

_implementation: Implementation | None = None


def setup(name: str | None = None) -> None:
    """Import the implementation ``name`` (default: the one ``ACCELERATE_IMPL`` names) once per rank."""
    global _implementation
    _implementation = Implementation.load(chosen(name))


def implementation() -> Implementation:
    if _implementation is None:
        setup()
    assert _implementation is not None
    return _implementation


def run_case(key: str, world_label: str, shared_dir: str) -> dict[str, Any]:
    """Run one case on this rank and classify what happened.

    Returns ``{"status", "message", "value", "duration_s"}``; never raises.
    """
    impl = implementation()
    world = WorldInfo.parse(world_label, shared_dir)
    rank = os.environ.get("RANK", "0")
    started = time.perf_counter()
    value: Any = None
    case = find(key)
    try:
        with mock.patch.dict(os.environ, case.env):
            value = case.function(impl, world)
        status, message = Status.PASS, ""
    except AssertionError as error:
        status, message = Status.FAIL, _describe(error, f"rank {rank}: assertion failed")
    except (NotSupported, NotImplementedError) as error:
        status, message = Status.NOT_SUPPORTED, f"rank {rank}: {type(error).__name__}: {error}"
    except Exception:
        status, message = Status.ERROR, f"rank {rank}: " + traceback.format_exc(limit=-8)
    finally:
        try:
            impl.reset()
        except Exception:
            status, message = Status.ERROR, f"rank {rank}: resetting the implementation's state failed:\n" + traceback.format_exc()
    return {
        "status": status.value,
        "message": message,
        "value": value,
        "duration_s": time.perf_counter() - started,
    }


def _describe(error: AssertionError, prefix: str) -> str:
    """The assertion's own message, else the failing line."""
    text = str(error)
    if text:
        return f"{prefix}: {text}"
    frames = traceback.extract_tb(error.__traceback__)
    where = frames[-1] if frames else None
    return f"{prefix} at {where.filename}:{where.lineno}: {where.line}" if where else prefix
