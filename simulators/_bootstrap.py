"""Entry point of every launched rank: ``python -m simulators._bootstrap ...``.

- ``python -m simulators._bootstrap SCRIPT [ARGS...]`` runs SCRIPT as
  ``__main__`` with ``sys.argv == [SCRIPT, *ARGS]`` and the script's folder
  first on ``sys.path``, as ``python SCRIPT ARGS...`` would.
- ``python -m simulators._bootstrap --call CALL_FILE RESULT_DIR`` (the Python
  API) unpickles ``(fn, args, kwargs)`` from CALL_FILE, calls ``fn``, and
  pickles the outcome to ``RESULT_DIR/rank<RANK>.pkl``: ``("ok", value)``,
  or ``("error", traceback_text)`` and exit status 1 when ``fn`` raised.

Before either, :func:`install_stack_dumper` arms faulthandler.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import runpy
import signal
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Callable

from simulators.spawn import STACK_FILE_ENV

CALL_FLAG = "--call"
_stack_stream = None  # kept open for faulthandler for the life of the process


def install_stack_dumper() -> None:
    """Fatal signals dump every thread's stack to stderr; SIGUSR1 dumps them to ``$SIMULATORS_STACK_FILE``.

    Without the variable, SIGUSR1 dumps to stderr. The process goes on running after a SIGUSR1 dump.
    """
    global _stack_stream
    faulthandler.enable(file=sys.stderr, all_threads=True)
    path = os.environ.get(STACK_FILE_ENV)
    _stack_stream = open(path, "a") if path else sys.stderr
    faulthandler.register(signal.SIGUSR1, file=_stack_stream, all_threads=True)


def result_path(result_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` of a ``--call`` run writes its outcome."""
    return result_dir / f"rank{rank}.pkl"


def write_call(call_file: Path, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Pickle a call for ``--call``; ``fn`` goes by reference, so it must be importable by name.

    A function of the driver's ``__main__`` script is found by re-running
    that script as ``__mp_main__`` in each rank, as multiprocessing does.
    """
    main_path = None
    if getattr(fn, "__module__", None) == "__main__":
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        if main_path is None:
            raise ValueError(f"{fn!r} lives in an interactive __main__; define it in a module or script")
    qualname = getattr(fn, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(f"{fn!r} cannot be pickled by reference; define it at module level")
    with open(call_file, "wb") as stream:
        pickle.dump(main_path and os.path.abspath(main_path), stream)
        pickle.dump((fn, args, kwargs), stream)


def read_result(path: Path) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", traceback_text)`` as written by a rank."""
    with open(path, "rb") as stream:
        return pickle.load(stream)


def _load_main(path: str) -> None:
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


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
    try:
        runpy.run_path(script, run_name="__main__")
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        return 1
    return 0


def main(argv: list[str]) -> int:
    install_stack_dumper()
    if argv and argv[0] == CALL_FLAG:
        return _call(*argv[1:])
    return _run_script(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
