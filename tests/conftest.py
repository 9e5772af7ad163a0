"""Shared fixtures of the project's own tests."""
import time
from pathlib import Path

import pytest


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for a parent to reap it, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.fixture
def assert_gone():
    """``assert_gone(pids)`` fails unless every pid is gone within 5 s (SIGKILL takes effect asynchronously)."""

    def check(pids, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive, f"processes still running: {alive}"

    return check


@pytest.fixture
def fresh_accelerate_state():
    """The reference's process-wide state forgotten before and after the test (as HF's own tests reset theirs)."""
    from accelerate_ref.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
