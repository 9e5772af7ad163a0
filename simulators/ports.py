"""Free TCP ports on loopback for rendezvous and control channels."""
from __future__ import annotations

import socket
import threading

from simulators.topology import LOOPBACK

#: Ports this process has handed out: the kernel may offer a port again as soon as it is released.
_given: set[int] = set()
#: How many offers of already-given ports to skip before taking one anyway (a process that used up the range).
_TRIES = 64
_lock = threading.Lock()


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel picks it; never a fixed port), and one this
    process has not handed out before.

    The port is released before returning, so another process could take it
    in between; the kernel hands out ports in rotation, which makes that rare,
    but it may offer a just-released port again (two worlds of one process
    would then meet at one rendezvous): such a port is skipped, up to ``_TRIES`` times.
    """
    with _lock:
        for _ in range(_TRIES):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                port = sock.getsockname()[1]
            if port not in _given:
                break
        _given.add(port)
        return port
