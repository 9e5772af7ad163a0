"""Whether this machine can hold a world, checked before any rank starts.

A world too large for the machine must fail at once with one line naming
the limit it hits, never start ranks that then hang or swap. Three limits
are checked, each with the need it is compared to:

- memory: ``MemAvailable`` must cover ``RANK_MEMORY_MB`` per rank plus the
  fork server. ``benchmarks/scale.py`` measured 14-37 MB PSS a forked rank
  after a collective case (150-160 MB a spawned one); 100 MB leaves room for
  cases that build models and for spawned ranks;
- file descriptors: the driver holds about 3 per rank (control channel,
  pidfd, log) and gloo's full mesh gives each rank about 2 per peer, under
  the soft ``RLIMIT_NOFILE`` every process here inherits;
- ports: gloo connects every pair of ranks, so a world of N uses about
  N*(N-1) ephemeral ports (each side of each pair, plus its listeners), which
  must fit in half of ``ip_local_port_range`` (the other half is left to the
  rest of the machine).
"""
from __future__ import annotations

import resource
from pathlib import Path

import psutil

from simulators.topology import World

RANK_MEMORY_MB = 100
SERVER_MEMORY_MB = 600
_DRIVER_FDS_PER_RANK = 3
_RANK_FDS_PER_PEER = 2
_FD_MARGIN = 256
_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class CapacityError(ValueError):
    """The world is larger than this machine can hold; the message names the limit."""


def check_world(world: World) -> None:
    """Raise :class:`CapacityError` naming the first limit ``world`` exceeds (memory, file descriptors, ports)."""
    size = world.size
    available_mb = psutil.virtual_memory().available // 2**20
    need_mb = size * RANK_MEMORY_MB + SERVER_MEMORY_MB
    if need_mb > available_mb:
        raise CapacityError(
            f"world {world.label} ({size} ranks) needs about {need_mb} MB of memory "
            f"({RANK_MEMORY_MB} MB a rank), but only {available_mb} MB is available: "
            f"at most {max(0, (available_mb - SERVER_MEMORY_MB) // RANK_MEMORY_MB)} ranks fit"
        )
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    need_fds = max(size * _DRIVER_FDS_PER_RANK, (size - 1) * _RANK_FDS_PER_PEER) + _FD_MARGIN
    if fd_limit != resource.RLIM_INFINITY and need_fds > fd_limit:
        raise CapacityError(
            f"world {world.label} ({size} ranks) needs about {need_fds} file descriptors per process, "
            f"over the limit of {fd_limit} (ulimit -n)"
        )
    ports = _ephemeral_ports()
    need_ports = size * (size - 1)
    if ports is not None and need_ports > ports // 2:
        raise CapacityError(
            f"world {world.label} ({size} ranks) needs about {need_ports} loopback ports for gloo's full mesh, "
            f"over half of the {ports} ephemeral ports (net.ipv4.ip_local_port_range)"
        )


def _ephemeral_ports() -> int | None:
    try:
        low, high = (int(part) for part in _PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        return None
    return high - low + 1
