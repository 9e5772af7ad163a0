"""Free TCP ports on loopback for rendezvous and control channels."""
from __future__ import annotations

import socket

from simulators.topology import LOOPBACK


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel picks it; never a fixed port).

    The port is released before returning, so another process could take it
    in between; the kernel hands out ports in rotation, which makes that rare.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]
