"""A persistent pool of rank processes that run one target after another.

Rules:
- ``start()`` starts one worker per rank (:mod:`simulators._worker`) with
  the torchrun environment and a fresh MASTER_PORT, and returns once every
  worker has run the setup and connected back over a control channel that is
  not torch.distributed (loopback TCP, random authkey);
- ``run(target, args, timeout)`` calls ``target(*args)`` on every rank and
  waits for the replies and the worker processes together:
  every rank replied -> "ok"; a worker died -> "crash" (exit code or signal
  kept, the rest killed); ``timeout`` passed -> "hang" (the Python stacks of
  the ranks that have not replied kept, all killed). Once one rank's reply
  is a failure (``failed(outcome)``; by default, the target raised), the
  ranks still running get ``grace`` seconds more, not the rest of
  ``timeout``: they are most likely waiting in a collective for the rank
  that failed, and their stacks say so sooner. At a hang or crash the
  pool also reads every live rank's torch Flight Recorder and keeps which
  collective each rank was in and which ranks never joined it
  (:mod:`simulators.flight_recorder`). After a crash or a hang
  the pool is torn down and the next ``run()`` starts it again;
- between targets the workers live on, and so does any process group a
  target created (the pool never touches torch.distributed);
- with ``start_method="fork"`` (the default) the workers are forked from a
  warmed server (:mod:`simulators._zygote`) that has imported torch, the
  worker and ``preload`` once; the server lives as long as the pool, so a
  restart after a crash or hang forks again without re-importing anything.
  A caller that starts pools one after another (a world at a time) can keep
  one server for all of them: ``fork_server``, a
  :class:`simulators.forking.KeptZygote` it owns and closes;
  ``"spawn"`` starts each worker as a fresh interpreter;
- ``close()`` kills and reaps every worker; it also runs at interpreter
  exit, and the kernel kills workers whose driver died (PDEATHSIG).

Worker output goes to one log file per rank; each result carries the tail
of what every rank wrote during that target. Not thread-safe: drive a pool
from one thread.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
from pathlib import Path
from typing import Literal

from simulators.flight_recorder import Diagnosis, diagnose
from simulators.forking import KeptZygote, Zygote, ZygoteError
from simulators.outcome import RankOutcome
from simulators.ports import free_port
from simulators.spawn import RankProcess, child_pythonpath, describe_exit, kill_all, spawn_world
from simulators.topology import LOOPBACK, World
from simulators.watchdog import dump_flight_records, dump_stacks

_WORKER = (sys.executable, "-m", "simulators._worker")
ADDRESS_ENV = "SIMULATORS_POOL_ADDRESS"  # host:port of the control channel
AUTHKEY_ENV = "SIMULATORS_POOL_AUTHKEY"  # its authkey, hex
SETUP_ENV = "SIMULATORS_POOL_SETUP"  # "module:function" each worker calls once at start
#: Seconds a peer of the control channel has to pass the authentication handshake.
HANDSHAKE_TIMEOUT_S = 5.0
_LOG = logging.getLogger(__name__)


@dataclass
class PoolResult:
    """How one target went on every rank.

    ``outcomes`` has the ranks that replied; ``stacks`` the Python stacks of
    the ranks still running at a hang; ``exit_codes`` the return codes of
    workers that died (negative: the signal); ``output_tail`` what each rank
    wrote while the target ran; ``collectives`` (at a hang or crash) which
    collective each rank was in; ``duration_s`` times the target, not a
    (re)start of the pool before it.
    """

    status: Literal["ok", "hang", "crash"]
    outcomes: dict[int, RankOutcome]
    stacks: dict[int, str] = field(default_factory=dict)
    exit_codes: dict[int, int] = field(default_factory=dict)
    output_tail: dict[int, str] = field(default_factory=dict)
    collectives: Diagnosis | None = None
    duration_s: float = 0.0


#: Seconds the other ranks get to reply once one rank's reply is a failure.
FAILURE_GRACE_S = 5.0


class PoolStartError(RuntimeError):
    """The workers did not all start, run the setup and connect; the message has their log tails."""


class RankPool:
    """``world.size`` persistent workers; see the module docstring for the rules."""

    def __init__(
        self,
        world: World,
        *,
        setup: str | None = None,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
        pythonpath: list[str] | None = None,
        start_method: Literal["fork", "spawn"] = "fork",
        preload: list[str] | None = None,
        fork_server: KeptZygote | None = None,
    ) -> None:
        """``fork_server``: the caller's kept fork server (its own ``preload``), used instead of one of the pool's."""
        if start_method not in ("fork", "spawn"):
            raise ValueError(f"start_method must be 'fork' or 'spawn', got {start_method!r}")
        if fork_server is not None and (preload or start_method == "spawn"):
            raise ValueError("a pool given a fork_server forks from it: it takes neither preload nor start_method='spawn'")
        self.world = world
        self.start_method = start_method
        self.preload = list(preload or [])
        self._fork_server = fork_server
        self._zygote: Zygote | None = None
        self.setup = setup
        self.start_timeout = start_timeout
        self._env = dict(env or {})
        self._pythonpath = list(pythonpath or [])
        self._workdir: Path | None = None
        self._ranks: list[RankProcess] = []
        self._conns: dict[int, Connection] = {}

    @property
    def running(self) -> bool:
        """Whether the workers are up (False before start, after close, and after a hang or crash)."""
        return bool(self._ranks)

    def start(self) -> None:
        """Start the workers and wait until each has run the setup and connected; no-op if running."""
        if self._ranks:
            return
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="simulators-pool-"))
            atexit.register(self.close)
        authkey = os.urandom(32)
        with socket.create_server((LOOPBACK, 0)) as server:
            env = {
                **self._env,
                ADDRESS_ENV: f"{LOOPBACK}:{server.getsockname()[1]}",
                AUTHKEY_ENV: authkey.hex(),
                SETUP_ENV: self.setup or "",
            }
            try:
                self._ranks = spawn_world(_WORKER, self.world, master_port=free_port(), workdir=self._workdir,
                                          env=env, pythonpath=self._pythonpath, logs=True, zygote=self._warm_zygote())
            except ZygoteError as error:
                raise self._start_error(str(error)) from None
            try:
                self._conns = self._connect(server, authkey)
            except BaseException:
                self._teardown()
                raise

    def run(
        self,
        target: str,
        args: tuple = (),
        timeout: float = 10.0,
        *,
        failed: Callable[[RankOutcome], bool] = lambda outcome: not outcome.ok,
        grace: float = FAILURE_GRACE_S,
    ) -> PoolResult:
        """Call ``target`` ("module:function") with ``args`` on every rank; (re)start the pool first if needed.

        After the first reply that is ``failed``, the other ranks have at most
        ``grace`` seconds left. Raises PoolStartError when the (re)start fails.
        """
        if self._ranks and not all(rank.alive() for rank in self._ranks):
            self._teardown()  # a worker died between targets: start clean rather than blame this one
        self.start()
        started = time.monotonic()
        offsets = {rank.rank: rank.log_size() for rank in self._ranks}
        since_ns = time.time_ns()
        try:
            result = self._run(target, args, timeout, failed, grace)
            if result.status != "ok":
                result.collectives = diagnose(dump_flight_records(self._ranks), self.world.size, since_ns)
        except BaseException:
            self._teardown()
            raise
        result.outcomes = dict(sorted(result.outcomes.items()))
        result.output_tail = {rank.rank: rank.log_tail(offsets[rank.rank]) for rank in self._ranks}
        if result.status != "ok":
            self._teardown()
        result.duration_s = time.monotonic() - started
        return result

    def close(self) -> None:
        """Kill and reap every worker and the fork server, and remove the pool's files. Idempotent."""
        self._teardown()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            atexit.unregister(self.close)

    def __enter__(self) -> RankPool:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(
        self, target: str, args: tuple, timeout: float, failed: Callable[[RankOutcome], bool], grace: float
    ) -> PoolResult:
        for conn in self._conns.values():
            try:
                conn.send(("run", target, args))
            except OSError:
                pass  # the worker is gone; its exit shows up below
        waiting = {conn: rank for rank, conn in self._conns.items()}
        outcomes: dict[int, RankOutcome] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            ready = wait([*waiting, *self._ranks], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                stuck = [rank for rank in self._ranks if rank.rank in waiting.values()]
                return PoolResult("hang", outcomes, stacks=dump_stacks(stuck))
            crashed = [obj for obj in ready if isinstance(obj, RankProcess)]
            for conn in (obj for obj in ready if isinstance(obj, Connection)):
                rank = waiting.pop(conn)
                try:
                    outcomes[rank] = conn.recv()
                except EOFError:
                    crashed.append(self._ranks[rank])
                except Exception as exc:  # the reply arrived but does not unpickle here
                    outcomes[rank] = RankOutcome.from_exception(rank, exc)
                if rank in outcomes and failed(outcomes[rank]):
                    deadline = min(deadline, time.monotonic() + grace)
            if crashed:
                return PoolResult("crash", outcomes, exit_codes=_exit_codes(crashed))
        return PoolResult("ok", outcomes)

    def _connect(self, server: socket.socket, authkey: bytes) -> dict[int, Connection]:
        """Accept one connection per worker and read its ("ready", rank, setup_outcome)."""
        deadline = time.monotonic() + self.start_timeout
        greeting: list[Connection] = []
        conns: dict[int, Connection] = {}
        try:
            while len(conns) < self.world.size:
                listening = [server] if len(greeting) + len(conns) < self.world.size else []
                ready = wait([*listening, *greeting, *self._ranks], timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    missing = [rank for rank in self._ranks if rank.rank not in conns]
                    raise self._start_error(
                        f"ranks {[rank.rank for rank in missing]} did not connect within {self.start_timeout}s",
                        dump_stacks(missing))
                for obj in ready:
                    if isinstance(obj, RankProcess):
                        raise self._start_error(f"rank {obj.rank} exited during start with "
                                                f"{describe_exit(obj.proc.wait())}")
                    if obj is server:
                        try:
                            greeting.append(_accept(server, authkey))
                        except (EOFError, OSError, AuthenticationError) as error:
                            # A worker that died while authenticating (its exit is reported next), or a
                            # stranger on the control channel's port: either way not a rank.
                            _LOG.warning("simulators: refused a connection to the control channel that failed "
                                         "authentication (%s)", _reason(error))
                        continue
                    greeting.remove(obj)
                    try:
                        _, rank, setup_outcome = obj.recv()
                    except EOFError:  # the worker died while greeting; its exit is reported next
                        obj.close()
                        continue
                    conns[rank] = obj
                    if setup_outcome is not None and not setup_outcome.ok:
                        raise self._start_error(f"setup {self.setup} failed on rank {rank}:\n{setup_outcome.error}")
        except BaseException:
            for conn in [*greeting, *conns.values()]:
                conn.close()
            raise
        return conns

    def _warm_zygote(self) -> Zygote | None:
        """The fork server to fork workers from: the caller's kept one, else the pool's own (started on first use,
        again if it died); None when workers are spawned."""
        if self.start_method == "spawn":
            return None
        env = {**os.environ, **self._env, "PYTHONPATH": child_pythonpath(self._pythonpath),
               "OMP_NUM_THREADS": self._env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
        if self._fork_server is not None:
            return self._fork_server.lasting(env)
        if self._zygote is not None and not self._zygote.alive:
            self._zygote.close()  # it died (killed from outside): reap it and start another
            self._zygote = None
        if self._zygote is None:
            assert self._workdir is not None
            self._zygote = Zygote(env, self._workdir / "zygote.log", self.preload)
        return self._zygote

    def _start_error(self, reason: str, stacks: Mapping[int, str] | None = None) -> PoolStartError:
        parts = [f"simulators: the pool of {self.world.label} ranks failed to start: {reason}"]
        for rank in self._ranks:
            if stacks and rank.rank in stacks:
                parts.append(f"--- rank {rank.rank} Python stacks ---\n{stacks[rank.rank].rstrip()}")
            parts.append(f"--- rank {rank.rank} log tail ---\n{rank.log_tail().rstrip()}")
        return PoolStartError("\n".join(parts))

    def _teardown(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns = {}
        kill_all(self._ranks)
        self._ranks = []


def _accept(server: socket.socket, authkey: bytes) -> Connection:
    """Accept a connection and authenticate it the way ``multiprocessing.connection.Listener`` does.

    A plain socket (rather than a Listener) can be waited on together with
    the worker processes, so a worker that dies during start is seen at once.
    The peer has `HANDSHAKE_TIMEOUT_S` to answer: one that stays silent (any
    program that connects to the port) raises OSError instead of stalling
    the start; one that answers wrongly raises AuthenticationError.
    """
    sock, _ = server.accept()
    with sock:
        sock.setblocking(True)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(HANDSHAKE_TIMEOUT_S))
        conn = Connection(os.dup(sock.fileno()))  # the same socket: the receive timeout applies to it
        try:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        except BaseException:
            conn.close()
            raise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(0))  # authenticated: block as long as it takes
    return conn


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` for SO_RCVTIMEO (0: no timeout)."""
    return struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))


def _reason(error: BaseException) -> str:
    if isinstance(error, BlockingIOError):
        return f"no answer within {HANDSHAKE_TIMEOUT_S:g} s"
    return str(error) or type(error).__name__


def _exit_codes(ranks: list[RankProcess]) -> dict[int, int]:
    """Return codes of ranks whose worker ended (their channel closed, so the exit is near)."""
    codes = {}
    for rank in ranks:
        try:
            codes[rank.rank] = rank.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    return codes
