"""Python stacks of live ranks, on demand: the rank side and the driver side.

Each rank calls :func:`install_stack_dumper` first thing, which registers
faulthandler on SIGUSR1 to write every thread's stack to the rank's stack
file; :func:`dump_stacks` signals the ranks and reads the files. faulthandler
writes the whole dump at once from its signal handler, even while the rank
is blocked in C code, so a dump is complete once the file has grown and then
stayed the same size for a short settle time.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from collections.abc import Sequence

from simulators.spawn import STACK_FILE_ENV, RankProcess

_POLL_S = 0.02
_SETTLE_S = 0.1
_stack_stream = None  # kept open for faulthandler for the life of the rank


def install_stack_dumper() -> None:
    """Fatal signals dump every thread's stack to stderr; SIGUSR1 dumps them to ``$SIMULATORS_STACK_FILE``.

    Without the variable, SIGUSR1 dumps to stderr. The process goes on running after a SIGUSR1 dump.
    """
    global _stack_stream
    faulthandler.enable(file=sys.stderr, all_threads=True)
    path = os.environ.get(STACK_FILE_ENV)
    _stack_stream = open(path, "a") if path else sys.stderr
    faulthandler.register(signal.SIGUSR1, file=_stack_stream, all_threads=True)


def dump_stacks(ranks: Sequence[RankProcess], timeout: float = 2.0) -> dict[int, str]:
    """Send SIGUSR1 to every live rank and return each one's Python stack text, by rank.

    Waits at most ``timeout`` seconds in all; a rank whose dump did not
    arrive in time gets a line saying so instead.
    """
    live = [rank for rank in ranks if rank.alive()]
    start_sizes = {}
    for rank in live:
        start_sizes[rank.rank] = rank.stack_file.stat().st_size
        try:
            os.kill(rank.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    sizes = dict(start_sizes)
    settled_at = {rank.rank: time.monotonic() for rank in live}
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        for rank in live:
            size = rank.stack_file.stat().st_size
            if size != sizes[rank.rank]:
                sizes[rank.rank], settled_at[rank.rank] = size, now
        waiting = [
            rank for rank in live
            if sizes[rank.rank] == start_sizes[rank.rank] or now - settled_at[rank.rank] < _SETTLE_S
        ]
        if not waiting or now >= deadline:
            break
        time.sleep(_POLL_S)
    stacks = {}
    for rank in live:
        with open(rank.stack_file, "rb") as stream:
            stream.seek(start_sizes[rank.rank])
            text = stream.read().decode("utf-8", "replace")
        stacks[rank.rank] = text or f"(no stack from rank {rank.rank} (pid {rank.pid}) within {timeout}s)\n"
    return stacks
