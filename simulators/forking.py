"""The driver's side of the warmed fork server (:mod:`simulators._zygote`).

:class:`Zygote` starts the server once (as a spawned process with every
isolation rule of :mod:`simulators.spawn`) and forks ranks from it;
:class:`ForkedProcess` is the part of ``subprocess.Popen`` the simulator
uses (``pid``, ``returncode``, ``poll()``, ``wait()``) for a rank that is the
zygote's child, not the driver's: its exit code arrives over the zygote's
reply pipe. If the zygote itself dies, its ranks die with it (PDEATHSIG) and
report ``-SIGKILL``.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from simulators._zygote import PRELOAD_ENV
from simulators.fork_root import start_module

_ZYGOTE = "simulators._zygote"
#: Modules every zygote imports: the rank's own entry point (callers add torch and the rest).
BASE_PRELOAD = ("simulators._worker",)
#: Seconds a dead rank's exit code may take to arrive from the zygote (it reaps, then reports).
EXIT_REPORT_S = 2.0


class ZygoteError(RuntimeError):
    """The fork server did not start or stopped answering; the message has its log tail."""


class Zygote:
    """A fork server with ``preload`` imported, running with ``env`` (it is the ranks' base environment)."""

    def __init__(self, env: Mapping[str, str], log_file: Path, preload: Sequence[str] = ()) -> None:
        self.log_file = log_file
        modules = ",".join(dict.fromkeys([*BASE_PRELOAD, *preload]))
        requests, requests_end = os.pipe()
        self._replies, replies = os.pipe()
        self._requests = os.fdopen(requests_end, "wb")
        try:
            with open(log_file, "ab") as log:
                self._proc = start_module(_ZYGOTE, (), {**env, PRELOAD_ENV: modules}, stdin=requests, stdout=replies,
                                          stderr=log.fileno())
        except BaseException:
            self._requests.close()
            os.close(self._replies)
            raise
        finally:
            os.close(requests)
            os.close(replies)
        self._buffer = b""
        self._started: list[int] = []
        self.exits: dict[int, int] = {}

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def fork(self, module: str, env: Mapping[str, str], log_file: Path, cwd: str | None, timeout: float,
             args: Sequence[str] = (), error_file: Path | None = None, finalize: bool = False) -> ForkedProcess:
        """Fork a child that runs ``python -m module *args`` with exactly ``env``, its output in ``log_file`` (its
        stderr in ``error_file`` when given); with ``finalize``, it ends as a spawned process does (atexit
        handlers, interpreter teardown) instead of with ``os._exit``. Wait at most ``timeout`` for its pid."""
        request = json.dumps({"module": module, "args": list(args), "env": dict(env), "log": str(log_file),
                              "errors": str(error_file) if error_file else None, "cwd": cwd, "finalize": finalize})
        try:
            self._requests.write(request.encode() + b"\n")
            self._requests.flush()
        except BrokenPipeError:
            raise self._error("the fork server is gone") from None
        deadline = time.monotonic() + timeout
        while not self._started:
            if not self.pump(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                raise self._error(f"the fork server did not fork a rank within {timeout}s")
            if not self.alive and not self._started:
                raise self._error("the fork server exited")
        return ForkedProcess(self, self._started.pop(0))

    def pump(self, timeout: float) -> bool:
        """Read the replies that arrive within ``timeout``; False when none did."""
        ready, _, _ = select.select([self._replies], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self._replies, 65536)
        if not chunk:
            time.sleep(min(timeout, 0.01))  # the zygote is gone: EOF stays readable
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, *fields = line.decode().split()
            if kind == "started":
                self._started.append(int(fields[0]))
            elif kind == "exit":
                self.exits[int(fields[0])] = int(fields[1])
        return True

    def close(self, timeout: float = 5.0) -> None:
        """End the zygote (its remaining children die with it) and reap it."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._proc.kill()
        self._proc.wait(timeout)
        self._requests.close()
        os.close(self._replies)

    def _error(self, reason: str) -> ZygoteError:
        tail = self.log_file.read_text(errors="replace")[-4000:] if self.log_file.exists() else ""
        return ZygoteError(f"{reason}; its log ends:\n{tail}")


class KeptZygote:
    """A :class:`Zygote` with ``preload`` kept from one use to the next, as multiprocessing's forkserver keeps its
    server: ranks of later uses with the same environment skip starting one (a Python and its torch import).

    A use with another environment replaces it; pytest's ``PYTEST_CURRENT_TEST``, which changes at every test
    and which no import reads, does not count, so that a test suite's calls share one zygote. It ends at the
    driver's exit (and dies with the driver before that, see :mod:`simulators.spawn`). It serves one use at a
    time: a use that finds it in use by another thread gets a zygote of its own for that use, and a forked copy
    of the driver never shares it."""

    def __init__(self, preload: Sequence[str]) -> None:
        self.preload = tuple(preload)
        self._lock = threading.Lock()
        self._zygote: Zygote | None = None
        self._env: dict[str, str] | None = None  # the kept zygote's environment, as far as imports read it
        self._folder: str | None = None
        os.register_at_fork(after_in_child=self._forget)
        atexit.register(self.close)

    @contextlib.contextmanager
    def use(self, env: Mapping[str, str]) -> Iterator[Zygote]:
        """The kept zygote for ranks whose base environment is ``env``, started or replaced when needed."""
        if not self._lock.acquire(blocking=False):
            with tempfile.TemporaryDirectory(prefix="simulators-zygote-") as folder, \
                    contextlib.closing(Zygote(env, Path(folder, "zygote.log"), self.preload)) as zygote:
                yield zygote
            return
        try:
            yield self._current(env)
        finally:
            self._lock.release()

    def lasting(self, env: Mapping[str, str]) -> Zygote:
        """The kept zygote for ranks that outlive this call (a rank pool's, between its targets), started or
        replaced when needed: its owner ends those ranks before asking again with another environment (a
        replaced zygote takes its ranks with it)."""
        with self._lock:
            return self._current(env)

    def _current(self, env: Mapping[str, str]) -> Zygote:
        if self._zygote is None or self._env != _imports_env(env) or not self._zygote.alive:
            self._end()
            self._folder = tempfile.mkdtemp(prefix="simulators-zygote-")
            self._zygote, self._env = Zygote(env, Path(self._folder, "zygote.log"), self.preload), _imports_env(env)
        return self._zygote

    @property
    def pid(self) -> int | None:
        """The kept zygote's process id (None while none is kept)."""
        return self._zygote.pid if self._zygote is not None else None

    def close(self) -> None:
        """End the kept zygote, if any."""
        with self._lock:
            self._end()

    def _end(self) -> None:
        if self._zygote is not None:
            self._zygote.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._zygote = self._env = self._folder = None

    def _forget(self) -> None:
        """In a forked copy of the driver: the zygote and its pipes are the parent's; start afresh."""
        self._lock = threading.Lock()
        self._zygote = self._env = self._folder = None


#: Variables that change while a driver runs and that no import reads: pytest's name of the test it runs.
_NOT_READ_AT_IMPORT = ("PYTEST_CURRENT_TEST",)


def _imports_env(env: Mapping[str, str]) -> dict[str, str]:
    """Of ``env``, what a zygote's imports could read (see :class:`KeptZygote`)."""
    return {name: value for name, value in env.items() if name not in _NOT_READ_AT_IMPORT}


class ForkedProcess:
    """A rank forked by a :class:`Zygote`: the subset of ``subprocess.Popen`` the simulator uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            while self.zygote.pump(0.0):
                pass
            self._settle()
            # Dead already (a zombie, or reaped) but not yet reported: the zygote's report is on its way.
            deadline = time.monotonic() + EXIT_REPORT_S
            while self.returncode is None and not running(self.pid) and time.monotonic() < deadline:
                self.zygote.pump(0.05)
                self._settle()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            self.zygote.pump(left)
        return self.returncode

    def _settle(self) -> None:
        if self.pid in self.zygote.exits:
            self.returncode = self.zygote.exits.pop(self.pid)
        elif not self.zygote.alive and not _exists(self.pid):
            self.returncode = -signal.SIGKILL  # died with its zygote; nobody left to report the code


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting for its parent (a zygote, say) to reap it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return False


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
