"""A warmed fork server for pool ranks: ``python -m simulators._zygote``.

The zygote imports ``torch`` and the modules named in
``$SIMULATORS_ZYGOTE_PRELOAD`` (comma-separated; one that fails to import is skipped, and the rank that
needs it meets the error itself) once, freezes the garbage
collector's view of them, then forks one child per request. The children
leave them frozen (Python's ``gc.freeze`` advice for a fork server): a
child's full collections, and its final one at interpreter exit, then never
walk the preloaded objects, which would write every one of their headers and
copy their pages into each child (a 7B dry run at 8 ranks: 10.8 CPU seconds
per rank and 2.19 GB of PSS with those walks, 7.2 s and 1.87 GB without). Ranks forked from it share the imported
modules' memory copy-on-write and skip the imports, which is what lets
64 ranks start on a 2-core machine.

Protocol (one JSON object or one text line per line):
- stdin, a request: ``{"module": "simulators._worker", "args": [...], "env": {...},
  "log": "/path/rankN.log", "errors": "/path/rankN.err", "cwd": null, "finalize": false}``
  (``args`` follow the module on ``sys.argv``; stderr goes to ``errors`` when given, else to
  ``log``; ``finalize``: see :func:`_become_rank`);
- stdout, replies in order: ``started PID`` after each fork, and
  ``exit PID CODE`` when a child ends (CODE negative: the signal), since only
  the zygote, the children's parent, can reap them.

Each child keeps every isolation rule of a spawned rank
(:mod:`simulators.spawn`): it leads its own session and process group, gets
``PR_SET_PDEATHSIG=SIGKILL`` (the zygote itself dies with the driver the
same way, so the chain ends with it), has exactly the environment of its
request, and dumps its stacks on SIGUSR1 to its own stack file. The zygote
ends when its stdin closes; its children die with it.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import select
import signal
import sys
import tempfile
import traceback

from simulators.spawn import die_with_parent
from simulators.watchdog import install_stack_dumper

PRELOAD_ENV = "SIMULATORS_ZYGOTE_PRELOAD"


def _become_rank(request: dict, zygote_pid: int, keep_closed: list[int]) -> None:
    """In the child: isolate, take the request's environment and output, run the module; never returns.

    The child leaves with ``os._exit``, or, when the request says ``"finalize": true``, as a spawned process
    would: atexit handlers, then the interpreter's teardown (where a library that aborts at exit shows it)."""
    code = 1
    try:
        os.setsid()
        die_with_parent(zygote_pid)
        for fd in keep_closed:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        for fd, path in ((1, request["log"]), (2, request.get("errors") or request["log"])):
            log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, fd)
            os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # the rank's TMPDIR, not a folder the zygote may have looked up
        if request.get("cwd"):
            os.chdir(request["cwd"])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        install_stack_dumper()
        _apply_torch_env()
        reseed_numpy()
        sys.argv = [request["module"], *request.get("args", ())]
        sys.modules.pop(request["module"], None)  # preloaded for its imports; runs afresh as __main__
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    if request.get("finalize"):
        raise SystemExit(code)  # out of the zygote's loop: the interpreter ends this child as it ends any process
    os._exit(code)


def _apply_torch_env() -> None:
    """Settings torch read from the zygote's environment at import, read again from the rank's."""
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available():
        distributed.set_debug_level_from_env()  # TORCH_DISTRIBUTED_DEBUG


def reseed_numpy() -> None:
    """Seed numpy's global random state afresh from the OS, as importing numpy.random seeds it in a spawned process
    (numpy/random/mtrand.pyx: ``_rand = RandomState()``); forked, every rank would share the zygote's stream.
    Python's ``random`` reseeds itself after a fork (``os.register_at_fork``); torch's default generator starts
    from the same fixed seed in every process anyway."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def main() -> int:
    install_stack_dumper()
    replies = os.dup(1)
    os.dup2(2, 1)  # stray prints go to the zygote's log, never into the protocol
    for name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
        module, _, attribute = name.partition(":")  # "package:Name": the package, then the name looked up in it
        try:
            loaded = importlib.import_module(module)
            if attribute:
                getattr(loaded, attribute)
        except Exception:  # the rank imports it again itself, and reports the error where its code asks for it
            print(f"simulators zygote: preloading {name} failed; the ranks import it themselves", file=sys.stderr)
            traceback.print_exc()
    gc.collect()
    gc.freeze()
    children: dict[int, int] = {}  # pidfd -> pid
    pending = b""
    while True:
        ready, _, _ = select.select([0, *children], [], [])
        for fd in ready:
            if fd == 0:
                chunk = os.read(0, 65536)
                if not chunk:
                    return 0
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    request = json.loads(line)
                    zygote_pid = os.getpid()
                    pid = os.fork()
                    if pid == 0:
                        _become_rank(request, zygote_pid, [replies, *children])
                    children[os.pidfd_open(pid)] = pid
                    os.write(replies, f"started {pid}\n".encode())
            else:
                pid = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                os.write(replies, f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    sys.exit(main())
