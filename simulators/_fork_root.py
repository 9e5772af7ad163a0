"""The root fork server: ``python -m simulators._fork_root SOCKET`` (its driver's side: :mod:`simulators.fork_root`).

Every Python process the simulator starts (a fork server, a rank, a driver) begins by importing torch: about
1.8 CPU seconds that are the same each time. The root keeps one process per *torch environment* that has imported
torch once and forks the processes asked of it from there, as if each had been started with
``python -m MODULE ARGS`` and its own environment, working directory and standard streams.

- The root itself imports nothing heavy. It listens on ``SOCKET`` (``AF_UNIX``, ``SOCK_SEQPACKET``: one message is
  one request, with its three stream descriptors attached) and hands each request, with the connection it came
  on, to the *base* for the request's torch environment (:func:`torch_environment`) and the entries of its path
  that provide device backends (:func:`device_backends`), forking that base first when there is none: the base
  takes the request's environment, imports torch, the modules of those backends' entry points and
  :data:`WITH_TORCH`, and serves from then on.
- A base forks one child per request and answers on the request's connection: ``started PID``, then
  ``exit CODE`` when the child ends (CODE negative: the signal), or ``refused REASON`` without forking when the
  child would not import what the base imported (:func:`shadowed`). A connection that closes before its child
  ends kills the child's process group: a child lives no longer than the process that asked for it.
- The root ends when its stdin closes; its bases die with it and their children with them
  (``PR_SET_PDEATHSIG``).

A forked child is a fresh process in every rule its code can observe: its environment, ``sys.argv``, working
directory, ``sys.path`` (its working directory, then its ``PYTHONPATH``, then the interpreter's own entries, as
Python builds it), standard streams, temporary folder, numpy's random stream, and the device backends torch
autoloads (``torch._import_device_backends``, torch/__init__.py, run for the child's ``sys.path``: it calls each
``torch.backends`` entry point, whose module the base imported). A backend must load before any module that
captures what it patches: a mock GPU patches ``torch.cuda``'s functions, which torch._dynamo's device interface
captures at import; so the base imports the backends' modules first, and what a backend does according to its
launch's environment (a mock GPU's memory reports) is its entry point's call, made in the child. What a child
cannot change is checked instead: the interpreter and what Python's start-up read from the environment must be the
root's (:func:`refusal`); what torch, its libraries and the backends' modules read at import, the base's
(:func:`torch_environment` keys the bases on it); the modules the base imported, the files the child's own
``sys.path`` would import them from (:func:`shadowed`). It ends as a spawned process ends: atexit handlers, then
the interpreter's teardown.
"""
from __future__ import annotations

import gc
import importlib
import importlib.machinery
import importlib.metadata
import io
import json
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Iterable, Mapping

from simulators._zygote import reseed_numpy
from simulators.spawn import die_with_parent

#: Prefixes of the variables Python's start-up reads (flags, encodings, the locale): a request's values of these
#: must equal the root's own, since its children keep the interpreter the root started.
READ_BY_PYTHON = ("PYTHON", "LC_", "LANG")
#: ... and of those torch, numpy, OpenMP and the C library read at import: a base serves only requests whose values
#: of these equal its own.
READ_AT_IMPORT = ("TORCH", "PYTORCH", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NPY_", "NUMPY_", "CUDA",
                  "NVIDIA_", "LD_", "MALLOC_", "GLIBC_")
#: ... but for these, which a child applies itself,
APPLIED_BY_CHILD = ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")
#: ... and these, which torch reads only when asked for what they set, never at import (torch 2.13): whether CUDA is
#: counted through NVML (torch/cuda/__init__.py, ``_nvml_based_avail``; HF accelerate sets it around its CUDA checks),
#: the signals torchrun's agent handles (torch/distributed/elastic/multiprocessing/api.py, ``PContext.start``; set by
#: torchrun's ``launch_agent`` in the process that runs it) and the Flight Recorder's size (read when a process group
#: is made: torch/distributed/distributed_c10d.py, and c10d's FlightRecorder, made on first use; the simulator sets
#: it for its ranks). Keyed on, they would split one test process's children between bases that differ in nothing
#: imported. ``tests/simulators/test_fork_root.py`` checks that importing what a base imports reads none of them.
READ_AT_RUN_TIME = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_FR_BUFFER_SIZE")
#: Largest request message (an environment of a few kilobytes, a command line).
MESSAGE_BYTES = 1 << 20
#: What a base imports after torch and its device backends' modules, once for all its children: the modules nearly
#: every fork server the simulator starts imports, about 1.3 s each time. DDP's constructor and every
#: optimizer step import torch._dynamo (torch/nn/parallel/distributed.py, torch/_compile.py); FSDP2 and DTensor are
#: the sharded runs'.
WITH_TORCH = ("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor")
#: ... and the prefixes of the variables they and the mock devices' modules read at import beyond
#: :data:`READ_AT_IMPORT`'s (torch._inductor's and functorch's configuration, sympy's and mpmath's settings, the user
#: name a cache folder is named after, psutil's debug switch; recorded while importing them, torch 2.13:
#: ``tests/simulators/test_fork_root.py`` checks the list): a base serves only requests whose values of these equal
#: its own too.
READ_WITH_TORCH = ("AOT", "INDUCTOR", "CUTEDSL", "CUTLASS", "CXX", "CI", "DUMP_", "ENABLE_", "FAKE_", "HOME",
                   "LNAME", "LOGNAME", "LOG_", "MPMATH_", "PARTITIONER_", "PSUTIL_", "PT2_", "SAGE_ROOT", "SYMPY_",
                   "UNSAFE_", "USER", "_PYTHON_")
#: The entry-point group torch loads device backends from at ``import torch`` (torch/__init__.py,
#: ``_import_device_backends``), unless ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is other than ``1``.
BACKENDS_GROUP = "torch.backends"


def _read(env: Mapping[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    return {name: value for name, value in env.items()
            if name.startswith(prefixes) and name not in APPLIED_BY_CHILD and name not in READ_AT_RUN_TIME}


def torch_environment(env: Mapping[str, str]) -> str:
    """The key of the base that may serve a request: the variables torch, its libraries, the mock devices' modules
    and :data:`WITH_TORCH` read at import."""
    return json.dumps(sorted(_read(env, (*READ_AT_IMPORT, *READ_WITH_TORCH)).items()))


def device_backends(request: Mapping) -> tuple[str, ...]:
    """The request's own ``sys.path`` entries that hold a distribution with a ``torch.backends`` entry point,
    which ``import torch`` would load in the child (none where the request turns autoloading off:
    ``_is_device_backend_autoload_enabled`` in torch/__init__.py). The interpreter's own entries are the root's."""
    if request["env"].get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
        return ()
    return tuple(folder for folder in _request_path(request) if _backend_entry_points(folder))


def base_imports(backends: tuple[str, ...]) -> list[str]:
    """What the base for children whose path provides ``backends`` imports after torch, in order: the modules of
    their ``torch.backends`` entry points (loaded, the entry points not called: that is each child's), then
    :data:`WITH_TORCH`."""
    return [*(entry.module for folder in backends for entry in _backend_entry_points(folder)), *WITH_TORCH]


def _backend_entry_points(folder: str) -> list[importlib.metadata.EntryPoint]:
    return [entry for dist in importlib.metadata.distributions(path=[folder]) for entry in dist.entry_points
            if entry.group == BACKENDS_GROUP]


def refusal(request: Mapping) -> str | None:
    """Why the root cannot serve ``request`` (another interpreter, or other start-up settings), or None."""
    if request["executable"] != sys.executable:
        return f"the root runs {sys.executable}"
    theirs, ours = _read(request["env"], READ_BY_PYTHON), _read(os.environ, READ_BY_PYTHON)
    if theirs != ours:
        return f"Python's start-up settings differ: {sorted(set(theirs.items()) ^ set(ours.items()))}"
    return None


def _request_path(request: Mapping) -> list[str]:
    """The entries Python puts before its own on ``sys.path`` for ``python -m`` in ``cwd`` with ``PYTHONPATH``."""
    cwd = request["cwd"]
    extra = [os.path.join(cwd, entry) for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    return list(dict.fromkeys(os.path.normpath(entry) for entry in [cwd, *extra]))


def _importable(folder: str) -> set[str]:
    """The top-level modules and regular packages importing from ``folder`` finds."""
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    suffixes = tuple(importlib.machinery.all_suffixes())
    found = {name.split(".", 1)[0] for name in names if name.endswith(suffixes)}
    return found | {name for name in names if os.path.isfile(os.path.join(folder, name, "__init__.py"))}


def _folder_of(module) -> str | None:
    """The ``sys.path`` entry ``module`` (a top-level one) was imported from, when it came from a file."""
    path = getattr(module, "__file__", None)
    if not path:
        return None
    folder = os.path.dirname(path)
    return os.path.dirname(folder) if os.path.basename(path).startswith("__init__.") else folder


def shadowed(prefix: Iterable[str], modules: Mapping[str, object]) -> str | None:
    """The first of ``modules`` (top-level, imported here) that a process whose ``sys.path`` begins with
    ``prefix`` would import from another file, or None: such a process must be spawned, not forked from here."""
    provided = [(entry, _importable(entry)) for entry in prefix]
    for name, module in modules.items():
        if "." in name or name.startswith("__") or (folder := _folder_of(module)) is None:
            continue
        found = next((entry for entry, names in provided if name in names), None)
        if found is not None and os.path.normpath(found) != os.path.normpath(folder):
            return f"{name} would be imported from {found}, not {folder}"
    return None


class _Base:
    """A process with torch, the device backends of one set of ``sys.path`` entries and :data:`WITH_TORCH` imported
    under one torch environment, forking children for the root's requests."""

    def __init__(self, channel: socket.socket, env: Mapping[str, str], interpreter_path: list[str],
                 backends: tuple[str, ...]) -> None:
        self.channel = channel
        self.interpreter_path = interpreter_path
        self.children: dict[int, tuple[int, socket.socket | None, bool]] = {}  # pidfd -> pid, connection, session
        os.environ.clear()
        os.environ.update({name: value for name, value in env.items() if name != "PYTHONPATH"})
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # each child runs the entry points its sys.path has
        import torch  # noqa: F401  (what every child would import first)

        sys.path[:0] = backends
        for module in base_imports(backends):
            try:
                importlib.import_module(module)
            except Exception:  # a child that needs it meets the error itself
                traceback.print_exc()
        gc.collect()
        gc.freeze()  # the children never walk these objects in their collections (see simulators._zygote)

    def serve(self) -> None:
        while True:
            connections = {conn: pidfd for pidfd, (_, conn, _) in self.children.items() if conn is not None}
            ready, _, _ = select.select([self.channel, *self.children, *connections], [], [])
            for item in ready:
                if item is self.channel:
                    message, fds, _, _ = socket.recv_fds(self.channel, MESSAGE_BYTES, 4)
                    if not message:
                        return  # the root is gone
                    self._start(json.loads(message), socket.socket(fileno=fds[0]), fds[1:])
                elif item in connections:
                    self._abandoned(connections[item])
                elif item in self.children:
                    self._reap(item)

    def _start(self, request: dict, conn: socket.socket, streams: list[int]) -> None:
        reason = shadowed(_request_path(request), sys.modules)
        if reason is None:
            pid = os.fork()
            if pid == 0:
                kept = [conn, self.channel, *self.children, *(c for _, c, _ in self.children.values() if c)]
                _become(request, streams, self.interpreter_path, kept)
            self.children[os.pidfd_open(pid)] = (pid, conn, bool(request.get("new_session")))
        for fd in streams:
            os.close(fd)
        conn.send(f"started {pid}".encode() if reason is None else f"refused {reason}".encode())
        if reason is not None:
            conn.close()

    def _abandoned(self, pidfd: int) -> None:
        """The asker closed its connection before the child ended: end the child (and its group)."""
        pid, conn, session = self.children[pidfd]
        for kill in (os.killpg, os.kill) if session else (os.kill,):  # the group it leads, once its setsid ran
            try:
                kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        conn.close()
        self.children[pidfd] = (pid, None, session)

    def _reap(self, pidfd: int) -> None:
        pid, conn, _ = self.children.pop(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if conn is not None:
            try:
                conn.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
            except OSError:
                pass
            conn.close()


def _become(request: dict, streams: list[int], interpreter_path: list[str], inherited: list) -> None:
    """In a base's child: become ``python -m MODULE ARGS`` as the request describes. Never returns: its
    ``SystemExit`` rises through the root's frames, none of which catches it, so Python's own exit follows."""
    try:
        if request.get("new_session"):
            os.setsid()
        die_with_parent(os.getppid())
        _close(inherited)
        for target, fd in zip((0, 1, 2), streams):
            os.dup2(fd, target)
            os.close(fd)
        _fresh_streams()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[:] = list(dict.fromkeys([*_request_path(request), *interpreter_path]))
        sys.path_importer_cache.clear()
        importlib.invalidate_caches()
        tempfile.tempdir = None
        torch = sys.modules["torch"]
        if torch._is_device_backend_autoload_enabled():
            torch._import_device_backends()
        reseed_numpy()
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()  # as Python reports an uncaught exception
        raise SystemExit(1)
    raise SystemExit(0)


def _close(items: Iterable[socket.socket | int]) -> None:
    """Close sockets (through their objects, which then never close their number again) and descriptors."""
    for item in items:
        item.close() if isinstance(item, socket.socket) else os.close(item)


def _fresh_streams() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` over the new descriptors, buffered as Python's start-up
    buffers them (create_stdio, Python/pylifecycle.c): under ``PYTHONUNBUFFERED`` the writers are unbuffered and
    write through; otherwise stdout is line-buffered on a terminal and stderr always."""
    encoding, errors, unbuffered = sys.stdout.encoding, sys.stdout.errors, bool(os.environ.get("PYTHONUNBUFFERED"))

    def stream(fd: int, mode: str, errors: str) -> io.TextIOWrapper:
        writer = mode == "wb"
        raw = open(fd, mode, buffering=0 if unbuffered and writer else -1, closefd=False)
        return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=unbuffered,
                                line_buffering=writer and not unbuffered and (fd == 2 or os.isatty(fd)))

    sys.stdin = sys.__stdin__ = stream(0, "rb", errors)
    sys.stdout = sys.__stdout__ = stream(1, "wb", errors)
    sys.stderr = sys.__stderr__ = stream(2, "wb", "backslashreplace")


def main(path: str) -> int:
    """Serve on ``path`` until stdin closes."""
    own_entries = {os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
    interpreter_path = [entry for entry in sys.path[1:] if entry not in own_entries]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    # (torch environment, the children's path entries that provide device backends) -> pid, pidfd, channel
    bases: dict[tuple[str, tuple[str, ...]], tuple[int, int, socket.socket]] = {}
    os.write(1, b"ready\n")
    while True:
        ended = {pidfd: key for key, (_, pidfd, _) in bases.items()}
        ready, _, _ = select.select([0, listener, *ended], [], [])
        if 0 in ready and not os.read(0, 4096):
            return 0
        for pidfd in set(ready) & set(ended):  # a base died (its import failed, say): the next request forks another
            pid, _, channel = bases.pop(ended[pidfd])
            channel.close()
            os.close(pidfd)
            os.waitpid(pid, 0)
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
            request = json.loads(message)
            if (reason := refusal(request)) is not None:
                conn.send(f"refused {reason}".encode())
            else:
                backends = device_backends(request)
                key = (torch_environment(request["env"]), backends)
                if key not in bases:
                    held = [listener, conn, *fds, *(channel for *_, channel in bases.values())]
                    bases[key] = _fork_base(request["env"], interpreter_path, held, backends)
                socket.send_fds(bases[key][2], [message], [conn.fileno(), *fds])
            conn.close()
            for fd in fds:
                os.close(fd)


def _fork_base(env: Mapping[str, str], interpreter_path: list[str], held: list[socket.socket | int],
               backends: tuple[str, ...]) -> tuple[int, int, socket.socket]:
    """Fork the base for ``env`` and for children whose path provides the device ``backends``; in it, close what the root
    ``held`` (its listener and channels, and the request being served with its streams: a base that kept a request's
    stdout would keep its reader from ever seeing the end of it)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(os.getppid())
            _close([*held, ours])
            os.close(0)
            os.dup2(2, 1)  # stray prints go to the root's log, not to its owner's pipe
            _Base(theirs, env, interpreter_path, backends).serve()
        except Exception:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    theirs.close()
    return pid, os.pidfd_open(pid), ours


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
