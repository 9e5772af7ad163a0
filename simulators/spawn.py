"""The one place that starts rank processes (used by the launcher and the pool).

Rules every rank process gets:
- the environment is ``os.environ`` + the torchrun variables of its rank
  (:func:`simulators.topology.rank_env`) + ``PYTHONPATH`` listing the
  driver's ``sys.path`` (so the driver's modules import in the rank) + the
  caller's extras, later entries winning;
- it leads its own session and process group, so :func:`kill_all` ends it
  together with anything it started;
- on Linux it gets ``PR_SET_PDEATHSIG=SIGKILL``: the kernel kills it when the
  thread that started it dies, even if the driver is SIGKILLed. (Start ranks
  from a thread that outlives them, normally the main thread.)
- with a :class:`simulators.forking.Zygote`, a rank running ``python -m
  MODULE`` is forked from that warmed server instead of started afresh:
  same environment, session, PDEATHSIG and stack file, less time and memory;
- ``SIMULATORS_STACK_FILE`` names a file where the rank writes every thread's
  Python stack on SIGUSR1 (installed by :mod:`simulators._bootstrap`), which
  :mod:`simulators.watchdog` reads; ``SIMULATORS_FR_FILE`` one where it
  writes torch's Flight Recorder dump on SIGUSR2 (``workdir/flight_recorder/
  rank_<N>``, the layout ``torchfrtrace`` reads), with the recorder on.
"""
from __future__ import annotations

import ctypes
import json
import functools
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path
from typing import TYPE_CHECKING

from simulators.capacity import check_world
from simulators.topology import World, rank_env

if TYPE_CHECKING:
    from simulators.forking import ForkedProcess, Zygote

STACK_FILE_ENV = "SIMULATORS_STACK_FILE"
#: A file the rank creates once its script or function has returned: a rank that dies after it
#: was there died at interpreter exit.
RETURNED_FILE_ENV = "SIMULATORS_RETURNED_FILE"
#: The script a script rank runs, as its frames name their file (set by the bootstrap; the line of a memory peak).
SCRIPT_ENV = "SIMULATORS_SCRIPT"
#: The folder where each rank of a script launch writes its memory report (see simulators.devices.memory.peaks).
MEMORY_REPORTS_ENV = "SIMULATORS_MEMORY_REPORTS"
FR_FILE_ENV = "SIMULATORS_FR_FILE"
#: torch's Flight Recorder on in every rank (entries kept), unless the environment sets it.
FR_BUFFER_ENV = {"TORCH_FR_BUFFER_SIZE": "256"}
TAIL_LINES = 100  # lines of a rank's output kept for reports
_TAIL_BYTES = 64 * 1024
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


@dataclass(eq=False)
class RankProcess:
    """One started rank: its process, where its stacks and output go, and a waitable exit handle.

    ``fileno()`` is a pidfd that becomes readable when the process exits, so
    a RankProcess can be passed to ``multiprocessing.connection.wait``.
    """

    rank: int
    proc: subprocess.Popen | ForkedProcess
    stack_file: Path
    log_file: Path | None
    exit_fd: int
    fr_file: Path | None = None
    #: Where its stderr goes when not into ``log_file`` (see :func:`spawn_world`'s ``like_spawned``).
    error_file: Path | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        return self.exit_fd

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, offset: int = 0) -> str:
        """The last TAIL_LINES lines this rank wrote to its log file after byte ``offset``."""
        if self.log_file is None:
            return ""
        size = self.log_file.stat().st_size
        with open(self.log_file, "rb") as log:
            log.seek(max(offset, size - _TAIL_BYTES))
            text = log.read().decode("utf-8", "replace")
        return "".join(text.splitlines(keepends=True)[-TAIL_LINES:])

    def log_size(self) -> int:
        """Bytes written to the log file so far (an offset for :meth:`log_tail`)."""
        return self.log_file.stat().st_size if self.log_file is not None else 0


def _exit_handle(pid: int) -> int:
    """A pidfd of ``pid``; for a rank already gone (one the fork server forked and reaped at once, a setup that
    exits at start), a descriptor that is readable already, as the pidfd of an exited process is."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        read, write = os.pipe()
        os.close(write)
        return read


def ready_path(fr_file: str | os.PathLike[str]) -> str:
    """The file a rank creates once it answers Flight Recorder requests
    (:func:`simulators.watchdog.install_flight_recorder_dumper`; before it, SIGUSR2 would end the rank)."""
    return f"{os.fspath(fr_file)}.ready"


def returned_path(workdir: Path, rank: int) -> Path:
    """The file rank ``rank`` creates when its script or function has returned (see `RETURNED_FILE_ENV`)."""
    return workdir / f"rank{rank}.returned"


def memory_report_path(folder: str | os.PathLike[str], rank: int) -> str:
    """The memory report of rank ``rank`` in ``folder``."""
    return os.path.join(folder, f"memory-rank{rank}.json")


def read_memory_reports(folder: str | os.PathLike[str], ranks: int) -> dict[int, dict[str, Any]]:
    """The memory reports the ranks of a launch wrote in ``folder`` (a rank that wrote none is absent)."""
    reports = {}
    for rank in range(ranks):
        try:
            with open(memory_report_path(folder, rank), encoding="utf-8") as stream:
                reports[rank] = json.load(stream)
        except (OSError, ValueError):
            continue
    return reports


def describe_exit(returncode: int) -> str:
    """``"exit code 1"``, or ``"signal SIGABRT"`` for a process killed by a signal."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def shell_status(returncode: int) -> int:
    """The status a shell would report: the exit code, or 128 + the signal number."""
    return 128 - returncode if returncode < 0 else returncode


def child_pythonpath(extra: Sequence[str] = ()) -> str:
    """``PYTHONPATH`` for a rank: ``extra``, then the driver's ``sys.path`` ('' becomes the cwd)."""
    entries = [*extra, *(entry or os.getcwd() for entry in sys.path)]
    return os.pathsep.join(dict.fromkeys(entries))


def base_env(env: Mapping[str, str], pythonpath: Sequence[str] = ()) -> dict[str, str]:
    """A rank's environment before its own variables: torch's Flight Recorder on, ``os.environ``, ``PYTHONPATH``
    listing ``pythonpath`` then the driver's ``sys.path``, then ``env`` (later entries winning)."""
    return {**FR_BUFFER_ENV, **os.environ, "PYTHONPATH": child_pythonpath(pythonpath), **env}


def die_with_parent(parent_pid: int) -> None:
    """In a new child (preexec_fn): ask the kernel to SIGKILL this child when its parent dies."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took hold
        os._exit(1)


def spawn_world(
    argv: Sequence[str],
    world: World,
    *,
    master_port: int,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    pythonpath: Sequence[str] = (),
    logs: bool = False,
    zygote: Zygote | None = None,
    like_spawned: bool = False,
) -> list[RankProcess]:
    """Start ``argv`` once per rank of ``world``; return the ranks in rank order.

    Output goes to pipes (``proc.stdout``/``proc.stderr``, text, for the
    caller to read) or, with ``logs=True``, stdout and stderr together to
    ``workdir/rank<N>.log``; ranks forked from ``zygote`` need ``logs=True``
    and ``argv`` of the form ``(python, "-m", MODULE, *ARGS)``. With ``like_spawned``, logged ranks
    keep stderr apart (``workdir/rank<N>.err``) and forked ones end as a spawned process does (atexit
    handlers, interpreter teardown), so that a caller sees the same ranks either way. If any rank fails to start, the ones already
    started are killed and the error propagates. A world larger than the
    machine can hold raises :class:`simulators.capacity.CapacityError` first.
    """
    check_world(world)
    ranks: list[RankProcess] = []
    try:
        for rank in range(world.size):
            ranks.append(
                _spawn_rank(argv, world, rank, master_port=master_port, workdir=workdir,
                            env=env or {}, cwd=cwd, pythonpath=pythonpath, logs=logs, zygote=zygote,
                            like_spawned=like_spawned)
            )
    except BaseException:
        kill_all(ranks)
        raise
    return ranks


def _spawn_rank(
    argv: Sequence[str],
    world: World,
    rank: int,
    *,
    master_port: int,
    workdir: Path,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    pythonpath: Sequence[str],
    logs: bool,
    zygote: Zygote | None = None,
    like_spawned: bool = False,
) -> RankProcess:
    stack_file = workdir / f"rank{rank}.stacks"
    stack_file.touch()
    fr_file = workdir / "flight_recorder" / f"rank_{rank}"
    fr_file.parent.mkdir(exist_ok=True)
    Path(ready_path(fr_file)).unlink(missing_ok=True)  # a rank started again answers once its own dumper waits
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    full_env = base_env(
        {
            **rank_env(world, rank, master_port),
            STACK_FILE_ENV: str(stack_file),
            RETURNED_FILE_ENV: str(returned_path(workdir, rank)),
            FR_FILE_ENV: str(fr_file),
            # A rank's temporary files (its own, a package's at import, torchrun's in a launch) live in
            # the workdir and go with it: ranks are killed, not finalized, so nothing else removes them.
            "TMPDIR": str(scratch),
            **env,
        },
        pythonpath,
    )
    log_file = workdir / f"rank{rank}.log" if logs else None
    error_file = workdir / f"rank{rank}.err" if logs and like_spawned else None
    if zygote is not None:
        if log_file is None or list(argv[1:2]) != ["-m"]:
            raise ValueError("a rank forked from a zygote runs `python -m MODULE` with logs=True")
        for path in filter(None, (log_file, error_file)):
            path.write_bytes(b"")
        proc = zygote.fork(argv[2], full_env, log_file, os.fspath(cwd) if cwd else None, timeout=30.0,
                           args=argv[3:], error_file=error_file, finalize=like_spawned)
        return RankProcess(rank, proc, stack_file, log_file, _exit_handle(proc.pid), fr_file, error_file)
    common = dict(
        env=full_env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )
    if log_file is not None:
        with open(log_file, "wb") as log, open(error_file or os.devnull, "wb") as errors:
            proc = subprocess.Popen(list(argv), stdout=log, stderr=errors if error_file else subprocess.STDOUT, **common)
    else:
        proc = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, encoding="utf-8", errors="replace", **common,
        )
    return RankProcess(rank, proc, stack_file, log_file, os.pidfd_open(proc.pid), fr_file)


def kill_all(ranks: Sequence[RankProcess], timeout: float = 5.0) -> None:
    """SIGKILL every rank's process group (the rank and what it started), then reap every rank.

    Safe on ranks that already exited: a process group id is not reused
    while any member lives, so the kill reaches only leftover children. The
    wait is bounded by ``timeout`` in all; a rank still not reaped then is
    reported with a RuntimeWarning.
    """
    for rank in ranks:
        signal_quietly(os.killpg, rank.pid)
        if rank.proc.returncode is None:  # not reaped yet, so the pid is still ours
            signal_quietly(os.kill, rank.pid)
    deadline = time.monotonic() + timeout
    stuck = []
    for rank in ranks:
        try:
            rank.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck.append(rank.rank)
        if rank.exit_fd >= 0:
            os.close(rank.exit_fd)
            rank.exit_fd = -1
    if stuck:
        warnings.warn(f"simulators: ranks {stuck} did not exit within {timeout}s of SIGKILL", RuntimeWarning)



def signal_quietly(send: Callable[[int, int], None], pid: int, signum: int = signal.SIGKILL) -> None:
    """``send(pid, signum)`` (``os.kill``, or ``os.killpg`` for the group ``pid`` leads), unless there is nothing
    left there to signal or it is not ours."""
    try:
        send(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
