"""One cosmic-ray session per module: enumerate its mutants, mark the ones not to run, run the rest one by one.

cosmic-ray mutates the file on disk and runs the slice's conformance command, whose rank processes import
``accelerate_ref`` from disk, so every rank sees the mutant; a non-zero exit kills it. The session database
(``<sessions>/<module>.sqlite``) is cosmic-ray's own, so ``cr-report`` and ``cosmic-ray dump`` read it too.

Mutants run in the order drawn, through cosmic-ray's ``mutate_and_test`` (what ``cosmic-ray exec``'s local
distributor calls for each pending mutant), so that the run can stop between two mutants when its time is spent.

Sources stay safe: cosmic-ray restores a file when a mutant's run ends or is interrupted (``KeyboardInterrupt``),
but not when its process is killed outright; so the driver keeps a copy of every file it mutates under
``<sessions>/pristine/`` for the length of the run, puts it back at the end, and :func:`recover` puts back any
copy an earlier, killed run left behind.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import psutil
from cosmic_ray.commands.init import init
from cosmic_ray.mutating import mutate_and_test
from cosmic_ray.testing import run_tests
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkItem, WorkResult

from .plan import Mutant
from .report import Result

#: What cosmic-ray's ``run_tests`` returns as the output of a test command it stopped at the timeout.
_TIMEOUT_OUTPUT = "timeout"


class SessionError(Exception):
    """A session that cannot run (its slice fails on the unmutated code): the CLI prints it as one line."""


@contextlib.contextmanager
def open_session(db_path: Path, root: Path, paths: Sequence[str]) -> Iterator[tuple[WorkDB, dict[Mutant, WorkItem]]]:
    """A fresh session at ``db_path`` (``cosmic-ray init`` with every core operator) for the files ``paths``
    (relative to ``root``), open for the ``with``; with each mutant's work item."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    db_path.unlink(missing_ok=True)
    with use_db(str(db_path), WorkDB.Mode.create) as db:
        init([root / path for path in paths], db, {})
        lines = {path: (root / path).read_text(encoding="utf-8").splitlines() for path in paths}
        items = {}
        for item in db.work_items:
            spec = item.mutations[0]
            path = Path(spec.module_path).relative_to(root).as_posix()
            line = spec.start_pos[0]
            span = (tuple(spec.start_pos), tuple(spec.end_pos))
            items[Mutant(path, spec.operator_name, spec.occurrence, line, lines[path][line - 1].strip(), span)] = item
        yield db, items


def skip(db: WorkDB, items: Sequence[WorkItem], why: str) -> None:
    """Record ``items`` as skipped (cosmic-ray's own outcome for work it is told not to run)."""
    db.set_multiple_results([item.job_id for item in items], WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why))


def baseline(command: Sequence[str], timeout: float) -> float:
    """Seconds the slice takes on the unmutated code; SessionError when it fails there (every mutant would look killed)."""
    started = time.monotonic()
    outcome, output = run_tests(shlex.join(command), timeout)
    if outcome != TestOutcome.SURVIVED:
        last = (output or "").strip().splitlines()[-1:] or ["no output"]
        raise SessionError(f"the slice fails on the unmutated code ({last[0]}): run {shlex.join(command)}")
    return time.monotonic() - started


def _outcome(result: WorkResult) -> str:
    if result.worker_outcome != WorkerOutcome.NORMAL:
        return "incompetent"
    if result.test_outcome == TestOutcome.SURVIVED:
        return "survived"
    if result.test_outcome == TestOutcome.KILLED:
        return "timeout" if result.output == _TIMEOUT_OUTPUT else "killed"
    return "incompetent"


def execute(db: WorkDB, queue: Sequence[tuple[Mutant, WorkItem]], command: Sequence[str], timeout: float,
            deadline: float, expected_s: float, on_result: Callable[[Result], None], root: Path) -> None:
    """Run ``queue`` in order, each mutant in place on disk against ``command``, recording each result in the
    session; stop before a mutant that would likely end after ``deadline`` (``time.monotonic()``), i.e. when
    fewer than ``expected_s`` seconds are left. The ones not reached stay pending in the session. Diffs name
    files relative to ``root``."""
    text = shlex.join(command)
    for mutant, item in queue:
        if time.monotonic() + expected_s > deadline:
            return
        started = time.monotonic()
        result = mutate_and_test(item.mutations, text, timeout)
        db.set_result(item.job_id, result)
        diff = (result.diff or "").replace(f"a/{root}/", "a/").replace(f"b/{root}/", "b/")
        on_result(Result(mutant, _outcome(result), round(time.monotonic() - started, 2), diff))


@contextlib.contextmanager
def pristine(root: Path, paths: Sequence[str], backups: Path) -> Iterator[None]:
    """Keep a copy of each of ``paths`` under ``backups`` for the ``with``, and put back any file that differs
    from its copy when it ends, however it ends (short of the process being killed: see :func:`recover`)."""
    for path in paths:
        copy = backups / path
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / path, copy)
    try:
        yield
    finally:
        recover(root, backups)


def recover(root: Path, backups: Path) -> list[str]:
    """Put back every file a copy under ``backups`` holds whose content differs, remove the copies, and return
    the paths put back (relative to ``root``)."""
    restored = []
    for copy in sorted(backups.rglob("*.py")) if backups.is_dir() else []:
        path = copy.relative_to(backups).as_posix()
        if (root / path).read_bytes() != copy.read_bytes():
            shutil.copy2(copy, root / path)
            restored.append(path)
        copy.unlink()
    shutil.rmtree(backups, ignore_errors=True)
    return restored


def stop_children() -> None:
    """Kill every process this one started and their descendants.

    cosmic-ray starts each slice in a session of its own (so that its timeout can kill the whole group), which
    also keeps a terminal's Ctrl-C from reaching it; the driver ends them itself. Ranks die with the runner
    (PDEATHSIG), and killing each child's whole process group takes them at once.
    """
    me = psutil.Process()
    descendants = me.children(recursive=True)
    for child in me.children():
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(descendants, timeout=5)
