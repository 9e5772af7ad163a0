"""Processes as the tests see them: a command-line module run as ``subprocess.run`` runs it, and in ``/proc``,
whether they are gone and whose children they are."""

from __future__ import annotations

import io
import locale
import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from simulators.fork_root import start_module
from simulators.forking import running  # a zombie, waiting for its parent to reap it, counts as gone


def run_module(module: str, *args: str, timeout: float, cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m module *args`` with its output captured as text, as ``subprocess.run(..., capture_output=True,
    text=True)`` captures it, but forked from the test process's root fork server where it accepts (torch imported
    once, see :mod:`simulators.fork_root`). Past ``timeout``, the process is killed and ``TimeoutExpired`` raised."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        with open(os.devnull, "rb") as stdin:
            process = start_module(module, args, dict(os.environ if env is None else env), stdin=stdin.fileno(),
                                   stdout=out_write, stderr=err_write, cwd=os.fspath(cwd) if cwd else None,
                                   new_session=False)
    finally:
        os.close(out_write)
        os.close(err_write)
    command = [sys.executable, "-m", module, *args]
    captured: dict[int, list[bytes]] = {out_read: [], err_read: []}
    reading = set(captured)
    deadline = time.monotonic() + timeout
    try:
        while reading:
            ready, _, _ = select.select(list(reading), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                process.kill()
                process.wait(10)
                raise subprocess.TimeoutExpired(command, timeout)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                captured[fd].append(chunk)
                if not chunk:
                    reading.discard(fd)
        returncode = process.wait(max(1.0, deadline - time.monotonic()))
    finally:
        os.close(out_read)
        os.close(err_read)
    return subprocess.CompletedProcess(command, returncode, _text(captured[out_read]), _text(captured[err_read]))


def _text(chunks: list[bytes]) -> str:
    """The bytes decoded as ``text=True`` decodes them: the locale's encoding, universal newlines."""
    data = b"".join(chunks)
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


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
