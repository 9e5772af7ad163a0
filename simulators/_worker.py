"""A rank of a :class:`simulators.pool.RankPool`: ``python -m simulators._worker``.

The worker arms faulthandler, runs the pool's setup ("module:function",
once), connects to the driver's control channel (address and authkey from
the environment; not torch.distributed) and reports ``("ready", rank,
setup_outcome)``. Then, for every ``("run", target, args)`` it receives, it
calls ``target(*args)`` and sends back a RankOutcome. An exception from a
target or the setup, whatever its kind, becomes a failed outcome; only the
driver ends the worker (by closing the channel or killing it).
"""
from __future__ import annotations

import importlib
import os
import pickle
import sys
from multiprocessing.connection import Client, Connection
from typing import Any, Callable

from simulators.outcome import RankOutcome
from simulators.pool import ADDRESS_ENV, AUTHKEY_ENV, SETUP_ENV
from simulators.watchdog import install_flight_recorder_dumper, install_stack_dumper


def resolve(target: str) -> Callable[..., Any]:
    """The object named ``"package.module:attr.path"``."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"bad target {target!r}: expected 'module:function'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    return obj


def call(rank: int, target: str, args: tuple) -> RankOutcome:
    """Call ``target(*args)``; whatever it raises becomes a failed outcome with its traceback."""
    try:
        return RankOutcome(rank, True, resolve(target)(*args), None)
    except BaseException as exc:  # a target must never end the worker
        return RankOutcome.from_exception(rank, exc)


def send(conn: Connection, outcome: RankOutcome) -> None:
    """Send ``outcome``; a value that cannot be pickled is sent as a failure saying so."""
    try:
        payload = pickle.dumps(outcome)
    except Exception as exc:
        failed = RankOutcome.from_exception(outcome.rank, exc)
        failed.error = f"the return value cannot be sent to the driver:\n{failed.error}"
        payload = pickle.dumps(failed)
    conn.send_bytes(payload)


def main() -> int:
    install_stack_dumper()
    install_flight_recorder_dumper()
    rank = int(os.environ["RANK"])
    setup = os.environ.get(SETUP_ENV)
    setup_outcome = call(rank, setup, ()) if setup else None
    host, port = os.environ[ADDRESS_ENV].rsplit(":", 1)
    with Client((host, int(port)), authkey=bytes.fromhex(os.environ[AUTHKEY_ENV])) as conn:
        conn.send(("ready", rank, setup_outcome))
        while True:
            try:
                kind, target, args = conn.recv()
            except EOFError:
                return 0
            if kind == "run":
                send(conn, call(rank, target, args))


if __name__ == "__main__":
    sys.exit(main())
