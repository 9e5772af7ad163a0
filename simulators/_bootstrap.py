"""Entry point of every launched rank: ``python -m simulators._bootstrap ...``.

- ``python -m simulators._bootstrap SCRIPT [ARGS...]`` runs SCRIPT as
  ``__main__`` with ``sys.argv == [SCRIPT, *ARGS]`` and the script's folder
  first on ``sys.path``, as ``python SCRIPT ARGS...`` would.
- ``python -m simulators._bootstrap --call CALL_FILE RESULT_DIR`` (the Python
  API) unpickles ``(fn, args, kwargs)`` from CALL_FILE, calls ``fn``, and
  pickles the outcome to ``RESULT_DIR/rank<RANK>.pkl``: ``("ok", value)``,
  or ``("error", traceback_text)`` and exit status 1 when ``fn`` raised.

Before either, :func:`simulators.watchdog.install_stack_dumper` arms faulthandler.
After either returns with status 0, the rank creates ``$SIMULATORS_RETURNED_FILE``,
so that the driver can tell a rank that died at interpreter exit (after its
work was done) from one that died during it.

A ``--call`` rank ends as multiprocessing's children do: it runs the
``atexit`` handlers, flushes its streams and leaves with ``os._exit``, so
that C++ destructors at interpreter teardown (gloo's threads, now and then
aborting with "terminate called without an active exception") cannot turn a
returned function into a failed rank. A script rank exits normally: a
script that aborts at exit is what the dry run must report.
"""
from __future__ import annotations

import atexit
import os
import pickle
import runpy
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from simulators.calls import CALL_FLAG, result_path
from simulators.spawn import RETURNED_FILE_ENV, SCRIPT_ENV
from simulators.watchdog import install_flight_recorder_dumper, install_stack_dumper


def _load_main(path: str) -> None:
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _release_process_group() -> None:
    """Destroy a process group the function left behind, so gloo does not abort at interpreter exit."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


def _call(call_file: str, result_dir: str) -> int:
    result = result_path(Path(result_dir), int(os.environ["RANK"]))
    with open(call_file, "rb") as stream:
        main_path = pickle.load(stream)
        if main_path:
            _load_main(main_path)
        fn, args, kwargs = pickle.load(stream)
    try:
        outcome: tuple[str, Any] = ("ok", fn(*args, **kwargs))
    except BaseException:
        outcome = ("error", traceback.format_exc())
    _release_process_group()
    try:
        payload = pickle.dumps(outcome)
    except Exception as exc:
        outcome = ("error", f"the return value of {fn.__qualname__} cannot be pickled: {exc!r}\n")
        payload = pickle.dumps(outcome)
    result.write_bytes(payload)
    if outcome[0] == "error":
        sys.stderr.write(outcome[1])
        return 1
    return 0


def _run_script(script: str, args: list[str]) -> int:
    """Run ``script``; an uncaught exception prints the script's frames only (as ``python script`` does) and gives 1."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    os.environ[SCRIPT_ENV] = script  # as the script's frames name their file (the line of a memory peak)
    try:
        runpy.run_path(script, run_name="__main__")
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        return 1
    return 0


def _leave(status: int) -> None:
    """End a ``--call`` rank without interpreter teardown: atexit handlers, flushed streams, ``os._exit``."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str]) -> int:
    install_stack_dumper()
    install_flight_recorder_dumper()
    calling = bool(argv) and argv[0] == CALL_FLAG
    status = _call(*argv[1:]) if calling else _run_script(argv[0], argv[1:])
    if status == 0 and os.environ.get(RETURNED_FILE_ENV):
        Path(os.environ[RETURNED_FILE_ENV]).touch()
    if calling:
        _leave(status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
