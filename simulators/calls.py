"""The files a ``--call`` rank reads and writes (see :mod:`simulators._bootstrap`)."""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any, Callable

CALL_FLAG = "--call"


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
