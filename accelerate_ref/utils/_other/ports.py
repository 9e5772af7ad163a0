"""Ports on this host: is one taken, and one the kernel says is free (🤗 Accelerate's ``utils.other`` pair).

Kept apart from ``utils.other`` (which imports torch) so the launcher starts quickly;
``utils.other`` and ``utils.launch`` re-export both. Catalog: launch.cli (``--main_process_port``).
"""

from __future__ import annotations

import socket
from typing import Optional

#: The rendezvous port torchrun and 🤗 Accelerate use when none is given.
DEFAULT_PORT = 29500


def is_port_in_use(port: Optional[int] = None) -> bool:
    """Whether something already listens on ``localhost:port`` (``port`` None means 29500)."""
    if port is None:
        port = DEFAULT_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port)) == 0


def get_free_port() -> int:
    """A port the kernel says is free now on every interface (what ``--main_process_port 0`` picks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
