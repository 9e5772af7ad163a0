"""Run a script or a function on every rank of a world, and diagnose what went wrong.

Rules:
- every rank's stdout/stderr is copied to the driver's, each line prefixed
  with ``[rank N]``; the last lines of each rank are kept for reports;
- the first rank to exit non-zero ends the run at once: the other ranks are
  killed and the report names the rank, its exit code or signal and its
  output tail;
- at the timeout, every live rank's Python stack is dumped (faulthandler),
  reported under a header naming the ranks still running, and the ranks are
  killed; the exit status is 124, as ``timeout(1)`` gives;
- however the run ends, no rank or process a rank started survives it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import IO, Any, Callable, Literal

from simulators.calls import CALL_FLAG, read_result, result_path, write_call
from simulators.ports import free_port
from simulators.forking import KeptZygote, Zygote
from simulators.spawn import (
    MEMORY_REPORTS_ENV, TAIL_LINES, RankProcess, base_env, describe_exit, kill_all, read_memory_reports, returned_path, shell_status,
    spawn_world,
)
from simulators.topology import World
from simulators.flight_recorder import Diagnosis, diagnose
from simulators.watchdog import dump_flight_records, dump_stacks

TIMEOUT_STATUS = 124
#: What the fork server of :func:`run`'s ranks imports: torch, which every rank function here reaches and which
#: reads nothing of a rank's own environment at import (its threads are set in each rank, see
#: :mod:`simulators._zygote`), and torch._dynamo, which DDP's constructor and every optimizer step import
#: (torch/nn/parallel/distributed.py; torch/_compile.py, ``_disable_dynamo``): about 1.5 s in each rank.
RUN_PRELOAD = ("torch", "torch._dynamo")
#: Seconds a rank whose script has returned gets to finish exiting after another rank failed.
EXITING_GRACE_S = 5.0
_BOOTSTRAP = (sys.executable, "-m", "simulators._bootstrap")
#: The fork server of :func:`run`, kept from one call to the next.
_RUN_ZYGOTE = KeptZygote([_BOOTSTRAP[2], *RUN_PRELOAD])


@dataclass
class LaunchResult:
    """How a launch ended.

    ``exit_codes`` holds the return code of every rank that exited on its
    own (negative: killed by that signal); ``running`` the ranks still
    running at a timeout, with their Python stacks in ``stacks``;
    ``failed_at_exit`` whether the failed rank had returned from its script
    or function before it died (an abort at interpreter exit, say).
    """

    status: Literal["ok", "failed", "timeout", "mismatch"]
    exit_code: int
    failed_rank: int | None = None
    exit_codes: dict[int, int] = field(default_factory=dict)
    running: list[int] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    output_tail: dict[int, str] = field(default_factory=dict)
    duration_s: float = 0.0
    message: str = ""
    failed_at_exit: bool = False
    #: At a timeout or a mismatch: the collective each rank was in, from torch's Flight Recorder.
    collectives: Diagnosis | None = None
    #: Per rank, its mock devices' memory report (see simulators.devices.memory.peaks); ranks without a mock device have none.
    memory: dict[int, dict] = field(default_factory=dict)


class RankFailure(RuntimeError):
    """A rank raised or died; ``traceback`` is its traceback text or, without one, its output tail."""

    def __init__(self, rank: int, exit_code: int, traceback: str, output_tail: str = "") -> None:
        self.rank, self.exit_code, self.traceback, self.output_tail = rank, exit_code, traceback, output_tail
        super().__init__(f"rank {rank} failed with {describe_exit(exit_code)}:\n{traceback}")


class RankTimeout(TimeoutError):
    """The timeout passed; ``stacks`` maps each rank still running to its Python stacks."""

    def __init__(self, timeout: float, running: list[int], stacks: dict[int, str]) -> None:
        self.timeout, self.running, self.stacks = timeout, running, stacks
        super().__init__(_timeout_message(timeout, running, stacks))


def launch(
    script_or_argv: str | os.PathLike[str] | Sequence[str],
    world: World,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    pythonpath: Sequence[str] = (),
    watch: float | None = None,
    preload: Sequence[str] = (),
) -> LaunchResult:
    """Run a Python script (``"train.py"`` or ``["train.py", *args]``) on every rank of ``world``.

    The script path is relative to ``cwd``; a missing script raises
    FileNotFoundError before any rank starts. ``pythonpath`` goes first on
    every rank's import path (a mock device's stand-in package). With
    ``watch``, each time no rank has exited for that many seconds the ranks'
    Flight Recorders are read, and ranks that entered different collectives
    (or one that takes equal shapes with other shapes) at the same sequence
    number of a group end the launch at once (status ``mismatch``, with the
    diagnosis and every rank's stack) instead of at the timeout. With
    ``preload`` (module names), the ranks are forked from a fork server that
    imported those modules once (:mod:`simulators._zygote`): they skip the
    imports and share the imported modules' memory. A run that
    does not succeed prints its report to stderr.
    """
    argv = [os.fspath(script_or_argv)] if isinstance(script_or_argv, (str, os.PathLike)) else list(script_or_argv)
    if not argv:
        raise ValueError("launch needs a script to run")
    script = Path(cwd or os.getcwd(), argv[0])
    if not script.is_file():
        raise FileNotFoundError(f"script not found: {script}")
    with tempfile.TemporaryDirectory(prefix="simulators-launch-") as workdir:
        reports = Path(workdir, "memory")
        reports.mkdir()
        env = {**(env or {}), MEMORY_REPORTS_ENV: str(reports)}
        with _fork_server(env, pythonpath, Path(workdir), preload) as zygote:
            result = _execute(
                [*_BOOTSTRAP, *argv], world, timeout=timeout, env=env,
                cwd=cwd, workdir=Path(workdir), pythonpath=pythonpath, watch=watch, zygote=zygote,
            )
        result.memory = read_memory_reports(reports, world.size)
    if result.status != "ok":
        print(result.message, file=sys.stderr, flush=True)
    return result


def run(
    fn: Callable[..., Any],
    world: int = 4,
    machines: int = 1,
    args: tuple = (),
    kwargs: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on every rank of a ``world``-rank world; return the values in rank order.

    ``fn`` travels by reference (a module-level function; the ranks get the
    driver's ``sys.path`` and working directory). The ranks are forked from a fork server
    that imported :data:`RUN_PRELOAD` once (:mod:`simulators._zygote`), kept for the next call
    with the same environment (:class:`simulators.forking.KeptZygote`). Raises RankFailure when
    a rank raises or dies, RankTimeout when ``timeout`` seconds pass first.
    """
    shape = World.of(world, machines)
    with tempfile.TemporaryDirectory(prefix="simulators-run-") as tmp:
        workdir = Path(tmp)
        call_file = workdir / "call.pkl"
        write_call(call_file, fn, tuple(args), dict(kwargs or {}))
        argv = [*_BOOTSTRAP, CALL_FLAG, str(call_file), str(workdir)]
        with _RUN_ZYGOTE.use(base_env(env or {})) as zygote:
            result = _execute(argv, shape, timeout=timeout, env=env, cwd=os.getcwd(), workdir=workdir, zygote=zygote)
        if result.status == "timeout":
            raise RankTimeout(timeout, result.running, result.stacks)
        if result.failed_rank is not None:
            raise _rank_failure(result, workdir, result.failed_rank)
        values = []
        for rank in range(shape.size):
            kind, value = _read_result(workdir, rank)
            if kind != "ok":
                raise _rank_failure(result, workdir, rank)
            values.append(value)
        return values


@contextlib.contextmanager
def _fork_server(env: Mapping[str, str] | None, pythonpath: Sequence[str], workdir: Path,
                 preload: Sequence[str]) -> Iterator[Zygote | None]:
    """A fork server for one launch's ranks that imported ``preload`` (None without one: the ranks are spawned)."""
    if not preload:
        yield None
        return
    with contextlib.closing(Zygote(base_env(env or {}, pythonpath), workdir / "zygote.log", [_BOOTSTRAP[2], *preload])) as zygote:
        yield zygote


def _read_result(workdir: Path, rank: int) -> tuple[str, Any]:
    path = result_path(workdir, rank)
    return read_result(path) if path.exists() else ("error", None)


def _rank_failure(result: LaunchResult, workdir: Path, rank: int) -> RankFailure:
    """The failure of ``rank``: its traceback, or, if it returned and then died, say so."""
    tail = result.output_tail.get(rank, "")
    kind, value = _read_result(workdir, rank)
    if kind == "ok":  # the function returned, then the process died (an abort at interpreter exit, say)
        value = f"rank {rank} returned from the function, then failed at interpreter exit"
    return RankFailure(rank, result.exit_codes.get(rank, 0), value or tail or "(exited without a result)", tail)


def _execute(
    argv: Sequence[str],
    world: World,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    workdir: Path,
    pythonpath: Sequence[str] = (),
    watch: float | None = None,
    zygote: Zygote | None = None,
) -> LaunchResult:
    started = time.monotonic()
    forked = zygote is not None
    ranks = spawn_world(argv, world, master_port=free_port(), workdir=workdir, env=env, cwd=cwd, pythonpath=pythonpath,
                        logs=forked, like_spawned=forked, zygote=zygote)
    output = _RankLogs(ranks) if forked else _RankPipes(ranks)
    try:
        result = _watch(ranks, timeout, watch, returned=lambda rank: returned_path(workdir, rank).exists())
    finally:
        kill_all(ranks)
        tails = output.join()
    if result.failed_rank is not None:
        result.failed_at_exit = returned_path(workdir, result.failed_rank).exists()
    result.output_tail = tails
    result.duration_s = time.monotonic() - started
    result.message = _report(result, timeout)
    return result


def _watch(
    ranks: Sequence[RankProcess], timeout: float | None, watch: float | None = None,
    returned: Callable[[int], bool] = lambda rank: False,
) -> LaunchResult:
    """Wait for every rank to exit; stop at the first failure, at a collective mismatch (with ``watch``, see
    :func:`launch`) or at the timeout. At a failure, ranks whose script has ``returned`` are given
    :data:`EXITING_GRACE_S` to finish exiting, so that their exit codes are known (see :func:`_reap_exiting`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(ranks)
    exit_codes: dict[int, int] = {}
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        watching = watch is not None and (remaining is None or remaining > watch)
        ready = sorted(wait(pending, timeout=watch if watching else remaining), key=lambda rank: rank.rank)
        if not ready and watching:
            collectives = diagnose(dump_flight_records(ranks), len(ranks))
            if any(verdict.mismatched for verdict in collectives.groups):
                return LaunchResult("mismatch", 1, exit_codes=exit_codes, running=[rank.rank for rank in pending],
                                    stacks=dump_stacks(pending), collectives=collectives)
            continue
        if not ready:
            stacks = dump_stacks(pending)
            collectives = diagnose(dump_flight_records(ranks), len(ranks))
            return LaunchResult("timeout", TIMEOUT_STATUS, exit_codes=exit_codes,
                                running=[rank.rank for rank in pending], stacks=stacks, collectives=collectives)
        for rank in ready:
            pending.remove(rank)
            exit_codes[rank.rank] = rank.proc.wait()
        failed = [rank.rank for rank in ready if exit_codes[rank.rank] != 0]
        if failed:
            _reap_exiting([rank for rank in pending if returned(rank.rank)], exit_codes)
            return LaunchResult("failed", shell_status(exit_codes[failed[0]]), failed_rank=failed[0],
                                exit_codes=exit_codes)
    return LaunchResult("ok", 0, exit_codes=exit_codes)


def _reap_exiting(exiting: Sequence[RankProcess], exit_codes: dict[int, int]) -> None:
    """Record the exit codes of ``exiting`` ranks (their script returned) that end within :data:`EXITING_GRACE_S`.

    A rank that has finished closes its gloo pairs as it exits, and a peer left waiting alone in a collective
    fails at that moment, often before the finished rank's own exit is seen: without its exit code, the dry run
    could not tell that rank as the one that had finished (``waited alone ... after rank(s) 0 had finished``)."""
    deadline = time.monotonic() + EXITING_GRACE_S
    pending = list(exiting)
    while pending and (remaining := deadline - time.monotonic()) > 0:
        for rank in wait(pending, timeout=remaining):
            pending.remove(rank)
            exit_codes[rank.rank] = rank.proc.wait()


#: Lines of each rank's output a launch keeps for the dry run's findings.
ANALYSED_LINES = 400
#: Seconds between two reads of forked ranks' log files.
LOG_POLL_S = 0.1


def _last_lines(text: str) -> str:
    return "".join(text.splitlines(keepends=True)[-TAIL_LINES:])


def _report(result: LaunchResult, timeout: float | None) -> str:
    if result.status == "ok":
        return f"simulators: all {len(result.exit_codes)} ranks exited 0 in {result.duration_s:.1f}s"
    if result.status == "timeout":
        found = f"\n{result.collectives.text()}" if result.collectives and result.collectives.groups else ""
        return _timeout_message(timeout, result.running, result.stacks) + found
    if result.status == "mismatch":
        return (f"simulators: ranks entered different collectives (or one collective with other shapes); stopped every rank "
                f"at once\n{result.collectives.text()}")
    rank = result.failed_rank
    when = " at interpreter exit, after its script returned," if result.failed_at_exit else ""
    return (
        f"simulators: rank {rank} failed{when} with {describe_exit(result.exit_codes[rank])}; "
        f"the other ranks were stopped\n--- rank {rank} output tail ---\n{_last_lines(result.output_tail.get(rank, ''))}"
    )


def _timeout_message(timeout: float | None, running: list[int], stacks: dict[int, str]) -> str:
    lines = [f"simulators: timed out after {timeout}s; ranks still running: {', '.join(map(str, running))}"]
    for rank in running:
        lines.append(f"--- rank {rank} Python stacks ---\n{stacks.get(rank, '(none)').rstrip()}")
    return "\n".join(lines)


class _RankOutput:
    """Copies each rank's output to the driver's stdout/stderr as ``[rank N] line``, keeping the last
    ANALYSED_LINES lines of each rank (stdout and stderr together): enough to reach back from an error to the
    line of the user's script under a deep stack (the mock CUDA device's modes add frames); reports show the
    last TAIL_LINES of them. Subclasses say where the output comes from."""

    def __init__(self, ranks: Sequence[RankProcess]) -> None:
        self._lock = threading.Lock()
        self._tails = {rank.rank: deque(maxlen=ANALYSED_LINES) for rank in ranks}
        self._threads: list[threading.Thread] = []

    def _start(self, target: Callable[..., None], *args: Any, name: str) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        self._threads.append(thread)
        thread.start()

    def _emit(self, rank: int, line: str, sink: IO[str]) -> None:
        line = line if line.endswith("\n") else line + "\n"
        with self._lock:
            self._tails[rank].append(line)
            sink.write(f"[rank {rank}] {line}")
            sink.flush()

    def join(self, timeout: float = 5.0) -> dict[int, str]:
        """Wait (bounded) for the output to end; return each rank's output tail."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return {rank: "".join(lines) for rank, lines in self._tails.items()}


class _RankPipes(_RankOutput):
    """A reader thread per pipe of each spawned rank, until the pipe closes."""

    def __init__(self, ranks: Sequence[RankProcess]) -> None:
        super().__init__(ranks)
        for rank in ranks:
            for pipe, sink in ((rank.proc.stdout, sys.stdout), (rank.proc.stderr, sys.stderr)):
                self._start(self._pump, rank.rank, pipe, sink, name=f"simulators-rank{rank.rank}-output")

    def _pump(self, rank: int, pipe: IO[str], sink: IO[str]) -> None:
        with pipe:
            for line in pipe:
                self._emit(rank, line, sink)


class _RankLogs(_RankOutput):
    """One thread following the log files of forked ranks (stdout's, stderr's) every ``LOG_POLL_S``, until
    :meth:`join` asks it to read what is left and stop."""

    def __init__(self, ranks: Sequence[RankProcess]) -> None:
        super().__init__(ranks)
        self._files = [(rank.rank, open(path, "rb"), sink) for rank in ranks
                       for path, sink in ((rank.log_file, sys.stdout), (rank.error_file, sys.stderr))]
        self._partial = [b""] * len(self._files)
        self._done = threading.Event()
        self._start(self._follow, name="simulators-rank-logs")

    def _follow(self) -> None:
        try:
            while not self._done.wait(LOG_POLL_S):
                self._read()
            self._read(final=True)
        finally:
            for _, stream, _ in self._files:
                stream.close()

    def _read(self, final: bool = False) -> None:
        for index, (rank, stream, sink) in enumerate(self._files):
            *lines, self._partial[index] = (self._partial[index] + stream.read()).split(b"\n")
            if final and self._partial[index]:
                lines.append(self._partial[index])
            for line in lines:
                self._emit(rank, line.decode("utf-8", "replace"), sink)

    def join(self, timeout: float = 5.0) -> dict[int, str]:
        self._done.set()
        return super().join(timeout)
