"""Processes as the tests see them in ``/proc``: whether they are gone and whose children they are. (A command-line
module run as ``subprocess.run`` runs it: :func:`simulators.fork_root.run_module`.)"""

from __future__ import annotations

import time
from pathlib import Path

from simulators.forking import running  # a zombie, waiting for its parent to reap it, counts as gone


def still_running(pids: list[int], timeout: float = 5.0) -> list[int]:
    """Of ``pids``, those still running after ``timeout`` seconds (a SIGKILL takes effect asynchronously)."""
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def children_of(pid: int) -> list[int]:
    """Pids of the running processes whose parent is ``pid``."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid) and running(int(status.parent.name)):
            found.append(int(status.parent.name))
    return found
