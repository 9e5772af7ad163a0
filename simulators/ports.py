"""Free TCP ports on loopback for rendezvous and control channels.

The rule: a port handed out here is one that nothing else on the machine takes
between the moment it is handed out and the moment rank 0 listens on it.

A port the kernel picks (``bind(("127.0.0.1", 0))``) cannot promise that: it is
released before rank 0 starts, and for the seconds a rank takes to import torch
every ``bind(0)`` and outgoing connection on the machine draws from the same
ephemeral range (gloo opens one listener per rank and world). When one of them
lands on the port, two worlds meet at one rendezvous and both fail in gloo's
``connectFullMesh`` ("Connection closed by peer"). So ports come from a rotation
*below* the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
which the kernel never hands out, advanced under a lock in the machine's
temporary folder, so every process on the machine (a suite's pytest workers,
ranks choosing a port for a nested launch) gets a different one; a port is
offered again only after the whole rotation has gone round. Only every other
port is handed out: the one after it stays free for the world's second
channel (the native backend's result store listens on MASTER_PORT + 1).
"""
from __future__ import annotations

import os
import socket
import tempfile

import filelock

from simulators.topology import LOOPBACK

#: The machine's temporary folder. Not ``$TMPDIR``: each simulated run gives its ranks a TMPDIR of their own,
#: where a lock shared between runs would never be seen.
MACHINE_TMP = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
#: How many ports below the ephemeral range the rotation spans.
ROTATION_SPAN = 8192
#: Ports launchers bind without being asked (torch's and accelerate's default MASTER_PORT 29500): never handed out.
DEFAULT_LAUNCH_PORTS = range(29400, 29600)
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_NEXT_FILE = os.path.join(MACHINE_TMP, "simulators-ports.next")
_LOCK_TIMEOUT_S = 30.0


def rotation() -> range | None:
    """The ports the rotation hands out, or None where the kernel leaves no room below its ephemeral range."""
    try:
        with open(_EPHEMERAL_RANGE, encoding="ascii") as handle:
            low = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    start = max(1024, low - ROTATION_SPAN)
    return range(start, low) if low - start >= 1024 else None


def free_port() -> int:
    """A TCP port free on 127.0.0.1, outside the kernel's ephemeral range, not handed out to any other process of
    this machine in the last ``ROTATION_SPAN // 2`` calls, and whose next port is never handed out; a kernel-picked
    port where no rotation is possible."""
    span = rotation()
    if span is None:
        return _kernel_port()
    ports = span[::2]
    lock = filelock.FileLock(_NEXT_FILE + ".lock")
    try:
        lock.acquire(timeout=_LOCK_TIMEOUT_S)
    except filelock.Timeout:
        raise TimeoutError(f"simulators: the port rotation's lock {lock.lock_file} stayed held for "
                           f"{_LOCK_TIMEOUT_S:.0f} s") from None
    try:
        index = _read_next(len(ports))
        for step in range(len(ports)):
            port = ports[(index + step) % len(ports)]
            if port not in DEFAULT_LAUNCH_PORTS and _bindable(port):
                _write_next((index + step + 1) % len(ports))
                return port
    finally:
        lock.release()
    return _kernel_port()


def _read_next(size: int) -> int:
    try:
        with open(_NEXT_FILE, encoding="ascii") as handle:
            return int(handle.read()) % size
    except (OSError, ValueError):
        return int.from_bytes(os.urandom(2), "big") % size


def _write_next(index: int) -> None:
    partial = f"{_NEXT_FILE}.{os.getpid()}"
    with open(partial, "w", encoding="ascii") as handle:
        handle.write(str(index))
    os.replace(partial, _NEXT_FILE)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]
