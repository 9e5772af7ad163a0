"""The driver's side of the root fork server (:mod:`simulators._fork_root`).

:class:`ForkRoot` starts a root and names its socket in ``$SIMULATORS_FORK_ROOT`` for its owner's process and
everything that inherits its environment; :func:`start_module` starts ``python -m MODULE ARGS`` from the named root
when there is one and it accepts the request, and as a spawned process otherwise, with the same environment,
working directory, streams, session and death rules either way; :func:`run_module` runs one to the end with its
output captured, as ``subprocess.run`` would. The simulator starts its fork servers
(:class:`simulators.forking.Zygote`) this way: a test suite that owns a root pays for torch's import once per
torch environment instead of once per fork server (a run of the project's ``make test`` started about 340 Python
processes without one, 216 with one, before its tests also ran their commands through it).
"""
from __future__ import annotations

import functools
import io
import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from simulators._fork_root import MESSAGE_BYTES
from simulators.spawn import die_with_parent

#: The socket of the root that :func:`start_module` asks first.
FORK_ROOT_ENV = "SIMULATORS_FORK_ROOT"
#: Seconds a root may take to answer a request: the first one of a torch environment waits for torch's import.
ANSWER_S = 60.0


class ForkRootError(RuntimeError):
    """The root fork server did not start; the message has its log's tail."""


class ForkRoot:
    """A root fork server owned by this process: started here, named in ``os.environ`` while it runs, ended by
    :meth:`close` (and with this process, whatever ends it)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="simulators-fork-root-"))
        self.socket_path = str(self.folder / "root.sock")
        self.log_file = self.folder / "root.log"
        package_parent = str(Path(__file__).resolve().parents[1])
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "simulators._fork_root", self.socket_path], cwd=self.folder,
                env={**os.environ, "PYTHONPATH": package_parent}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid()))
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready or self._proc.stdout.readline() != b"ready\n":
            self.close()
            raise ForkRootError(f"the root fork server did not start within {timeout}s; its log ends:\n"
                                f"{self.log_file.read_text(errors='replace')[-2000:]}")
        self._previous = os.environ.get(FORK_ROOT_ENV)
        os.environ[FORK_ROOT_ENV] = self.socket_path

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        """End the root, its bases and what they forked; forget it in ``os.environ``."""
        if os.environ.get(FORK_ROOT_ENV) == self.socket_path:
            if self._previous is None:
                del os.environ[FORK_ROOT_ENV]
            else:
                os.environ[FORK_ROOT_ENV] = self._previous
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait(10)
        for stream in (self._proc.stdin, self._proc.stdout):
            stream.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ForkRoot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RootChild:
    """A process a root forked: the part of ``subprocess.Popen`` the simulator uses. Its exit code arrives on the
    request's connection; closing that connection (:meth:`kill`, or this process's end) kills it."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self._conn = conn
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            self._read(left)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Signal the child, unless it has ended: its base may have reaped it before its exit report arrived here,
        and then there is nothing left to signal (as ``subprocess.Popen.send_signal`` takes it)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if ready:
            reply = self._conn.recv(256).decode()
            # No reply: the base is gone, and the child died with it.
            self.returncode = int(reply.split()[1]) if reply.startswith("exit ") else -signal.SIGKILL
            self._conn.close()


def start_module(module: str, args: Sequence[str], env: Mapping[str, str], *, stdin: int, stdout: int, stderr: int,
                 cwd: str | None = None, new_session: bool = True) -> subprocess.Popen | RootChild:
    """``python -m module *args`` with exactly ``env`` and the three descriptors as its streams, dying with the
    calling thread's process: forked from the root named in ``env`` when it accepts, else spawned."""
    root = env.get(FORK_ROOT_ENV)
    if root:
        child = _ask_root(root, {"executable": sys.executable, "module": module, "args": list(args), "env": dict(env),
                                 "cwd": os.path.abspath(cwd or os.getcwd()), "new_session": new_session},
                          [stdin, stdout, stderr])
        if child is not None:
            return child
    return subprocess.Popen([sys.executable, "-m", module, *args], env=dict(env), cwd=cwd, stdin=stdin, stdout=stdout,
                            stderr=stderr, start_new_session=new_session,
                            preexec_fn=functools.partial(die_with_parent, os.getpid()))


def _ask_root(path: str, request: dict, streams: list[int]) -> RootChild | None:
    """The child the root at ``path`` forked for ``request``, or None when it refused or is not there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], streams)
        ready, _, _ = select.select([conn], [], [], ANSWER_S)
        reply = conn.recv(MESSAGE_BYTES).decode() if ready else ""
    except OSError:
        reply = ""
    if reply.startswith("started "):
        return RootChild(conn, int(reply.split()[1]))
    conn.close()
    return None


def run_module(module: str, *args: str, timeout: float, cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m module *args`` with its output captured as text, as ``subprocess.run(..., capture_output=True,
    text=True)`` captures it, but started by :func:`start_module` (forked from the root named in ``env``, default
    this process's environment, where it accepts) and dying with this process. Past ``timeout``, the process is
    killed and ``TimeoutExpired`` raised."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        with open(os.devnull, "rb") as stdin:
            process = start_module(module, args, dict(os.environ if env is None else env), stdin=stdin.fileno(),
                                   stdout=out_write, stderr=err_write, cwd=os.fspath(cwd) if cwd else None,
                                   new_session=False)
    finally:
        os.close(out_write)
        os.close(err_write)
    command = [sys.executable, "-m", module, *args]
    captured: dict[int, list[bytes]] = {out_read: [], err_read: []}
    reading = set(captured)
    deadline = time.monotonic() + timeout
    try:
        while reading:
            ready, _, _ = select.select(list(reading), [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                process.kill()
                process.wait(10)
                raise subprocess.TimeoutExpired(command, timeout)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                captured[fd].append(chunk)
                if not chunk:
                    reading.discard(fd)
        returncode = process.wait(max(1.0, deadline - time.monotonic()))
    finally:
        os.close(out_read)
        os.close(err_read)
    return subprocess.CompletedProcess(command, returncode, _text(captured[out_read]), _text(captured[err_read]))


def _text(chunks: list[bytes]) -> str:
    """The bytes decoded as ``text=True`` decodes them: the locale's encoding, universal newlines."""
    data = b"".join(chunks)
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()
