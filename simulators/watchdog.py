"""Python stacks and collective records of live ranks, on demand: the rank side and the driver side.

Each rank calls :func:`install_stack_dumper` first thing, which registers
faulthandler on SIGUSR1 to write every thread's stack to the rank's stack
file; :func:`dump_stacks` signals the ranks and reads the files. faulthandler
writes the whole dump at once from its signal handler, even while the rank
is blocked in C code, so a dump is complete once the file has grown and then
stayed the same size for a short settle time.

Collectives: a rank started with ``$SIMULATORS_FR_FILE`` also runs
:func:`install_flight_recorder_dumper`: a thread that, on SIGUSR2, writes
torch's Flight Recorder dump (``torch._C._distributed_c10d._dump_fr_trace``,
the pickle format ``torchfrtrace`` reads; torch 2.13 records gloo
collectives when ``TORCH_FR_BUFFER_SIZE`` is set, and its group table is
rebuilt from c10d so that ``torchfrtrace`` can analyse gloo dumps) to that file. The thread
works while the main thread is blocked in a collective (gloo releases the
GIL there), which a Python signal handler would not. :func:`dump_flight_records`
signals the ranks and reads the dumps back.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import threading
import signal
import sys
import time
from collections.abc import Sequence

from simulators.spawn import FR_FILE_ENV, STACK_FILE_ENV, RankProcess, ready_path

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


def install_flight_recorder_dumper() -> None:
    """On SIGUSR2, write torch's Flight Recorder dump to ``$SIMULATORS_FR_FILE`` (no-op without it).

    SIGUSR2 is blocked in the calling thread (call it from the main thread
    before any other thread starts, so every thread inherits the mask) and
    taken by a daemon thread with ``sigwait``. The dump is written to a
    temporary name and renamed, so a reader never sees half a file. Once the
    thread waits, :func:`ready_path` exists: before it, SIGUSR2 would end the
    process, so :func:`dump_flight_records` asks only ranks that made it.
    """
    path = os.environ.get(FR_FILE_ENV)
    if not path:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})

    def serve() -> None:
        while True:
            signal.sigwait({signal.SIGUSR2})
            partial = f"{path}.partial"
            with open(partial, "wb") as stream:
                stream.write(_flight_recorder_dump())
            os.replace(partial, path)

    threading.Thread(target=serve, name="simulators-flight-recorder", daemon=True).start()
    open(ready_path(path), "w").close()


def _flight_recorder_dump() -> bytes:
    """This process's Flight Recorder dump (pickle), or a pickled empty dump before torch.distributed is used."""
    if "torch.distributed" in sys.modules:
        try:
            from torch._C._distributed_c10d import _dump_fr_trace

            dump = pickle.loads(_dump_fr_trace(True, False, False))  # with stack traces it takes ~10 s (it imports sympy)
        except Exception as exc:  # an older torch, or a build without c10d
            return pickle.dumps({"entries": [], "error": repr(exc)})
        dump["pg_config"] = _group_config() or dump.get("pg_config", {})
        return pickle.dumps(dump)
    return pickle.dumps({"entries": []})


def _group_config() -> dict[str, dict[str, str]]:
    """``pg_config`` as ``torchfrtrace`` reads it, from c10d's own registry of this process's groups.

    torch 2.13's gloo dumps key ``pg_config`` by ``""`` while their entries
    name the group ``"0"``, and ``torchfrtrace`` stops on that (KeyError); the
    registry gives each group's name, description and global ranks.
    """
    from torch.distributed import distributed_c10d as c10d

    return {
        name: {"name": name, "desc": group.group_desc, "ranks": str(sorted(c10d._world.pg_group_ranks[group]))}
        for group, name in c10d._world.pg_names.items()
    }


def dump_flight_records(ranks: Sequence[RankProcess], timeout: float = 2.0) -> dict[int, dict]:
    """Send SIGUSR2 to every live rank and return each one's Flight Recorder dump (a dict), by rank.

    Ranks without a record file, and dumps that do not arrive within
    ``timeout`` seconds in all, are left out.
    """
    live = [rank for rank in ranks if rank.alive() and rank.fr_file is not None and os.path.exists(ready_path(rank.fr_file))]
    for rank in live:
        rank.fr_file.unlink(missing_ok=True)
        try:
            os.kill(rank.pid, signal.SIGUSR2)
        except ProcessLookupError:
            pass
    records: dict[int, dict] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rank in live:
            if rank.rank not in records and rank.fr_file.exists():
                with open(rank.fr_file, "rb") as stream:
                    records[rank.rank] = pickle.load(stream)
        if all(rank.rank in records or not rank.alive() for rank in live):  # a rank that exited sends nothing
            break
        time.sleep(_POLL_S)
    return records
