"""The ``native`` backend: cases run inside the ranks another launcher started (torchrun, ``accelerate launch``).

* **It runs what it names.** Every rank imports the implementation ``--impl`` names itself, then the ranks agree
  before any case runs: each rank's :class:`Identity` (the module's name, file and version, read after the import,
  and a digest of the suite's catalog and cases) goes to rank 0, which compares them. A rank that cannot import the
  implementation, or that imported another one (or another version, or another suite), stops every rank with one
  line (:class:`NativeLaunchError`); no rank is left waiting. The report's header shows rank 0's identity.
* **Lock-step over a store of its own.** Outcomes travel over a ``TCPStore`` (``MASTER_PORT + 1``, or
  ``CONFORMANCE_STORE_PORT``) beside the process group under test, so a broken collective cannot hide a failure.
* **Output captured.** Each case's output on file descriptors 1 and 2 (Python's, a C library's, tqdm's bars) goes
  to a file per rank and comes back in the result, as the simulator keeps its ranks' logs.
* **A scratch folder per run**, made by rank 0, named in the agreement, removed at the end.
* A rank past the case timeout prints every thread's stack on its console and exits, which ends the launch; rank 0
  first reports the case as a HANG and has the reports written with the results so far. A rank that never replies
  is a HANG too.
"""

from __future__ import annotations

import faulthandler
import hashlib
import os
import pickle
import shutil
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Callable, Iterator, NoReturn

from simulators.spawn import TAIL_LINES
from simulators.topology import World

from . import worker
from .case import Case, WorldInfo, all_cases
from .merge import merge_incomplete, merge_replies, result
from .results import Emit, Status

#: Seconds the ranks wait for each other at the start (imports on a loaded machine) and at the end.
AGREE_TIMEOUT_S = 120.0
#: Seconds past a case's timeout before faulthandler ends a rank whose watchdog thread never ran.
WATCHDOG_GRACE_S = 30.0
#: Seconds past a case's timeout rank 0 waits for the others' replies: a rank still running by then is past its
#: own timeout (it started the case before rank 0 finished it), and its watchdog has fired.
EXCHANGE_GRACE_S = 10.0
#: Exit status of a rank ended by a hang.
HANG_EXIT_STATUS = 3
#: Seconds a rank ended by a hang waits for rank 0 to have written the reports.
REPORT_WAIT_S = 90.0
#: Bytes of a case's output kept per rank (its last TAIL_LINES lines within them).
OUTPUT_TAIL_BYTES = 64 * 1024


#: What rank 0 knows of ranks that never replied: their own launcher printed the rest.
_MISSING_DETAIL = ("a rank past its case timeout dumps its Python stack to the launcher's console and exits; "
                   "the launcher's output has it and the exit status")


def say(line: str) -> None:
    """``line`` on stderr in one write: the ranks of a launch share their stderr, and a line written in two
    parts (``print`` writes the text, then the newline) may have another rank's between them."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


class NativeLaunchError(Exception):
    """The ranks cannot run the suite together: a bad launch environment, an implementation that does not import
    on some rank, ranks that disagree on what they imported. Its text is one line."""


@dataclass(frozen=True)
class Identity:
    """What one rank imported, read after the import."""

    module: str
    path: str
    version: str
    #: Digest of the packaged catalog and the suite's case keys: ranks running other suites disagree.
    suite: str
    host: str

    def label(self) -> str:
        return f"{self.module} {self.version} ({self.path})"


def suite_digest() -> str:
    """A short digest of the packaged catalog and every case key of the suite."""
    from importlib import resources

    text = resources.files("conformance").joinpath("catalog.md").read_text(encoding="utf-8")
    keys = "\n".join(sorted(c.key for c in all_cases()))
    return hashlib.sha256(f"{text}\n{keys}".encode()).hexdigest()[:12]


def import_identity(impl: str) -> Identity:
    """Import ``impl`` in this rank (the worker keeps it for the cases) and say what came in."""
    worker.setup(impl)
    loaded = worker.implementation()
    path = getattr(loaded.module, "__file__", None) or "<no file>"
    return Identity(loaded.name, path, loaded.version, suite_digest(), socket.gethostname())


def disagreement(identities: dict[int, Identity | str]) -> str:
    """One line on what keeps the ranks from running together, or "" when they agree.

    A value that is a string is a rank's import error. Ranks must agree on the module, its version and the suite;
    ranks on one host must have imported the same file too.
    """
    failed = {rank: error for rank, error in identities.items() if isinstance(error, str)}
    if failed:
        rank, error = min(failed.items())
        others = f" (and ranks {sorted(failed)[1:]})" if len(failed) > 1 else ""
        return f"rank {rank}{others}: {error}"
    first = identities[0]
    assert isinstance(first, Identity)
    for rank, seen in sorted(identities.items()):
        assert isinstance(seen, Identity)
        same_host = seen.host == first.host
        if (seen.module, seen.version, seen.suite) != (first.module, first.version, first.suite) or (
            same_host and seen.path != first.path
        ):
            return (f"ranks disagree on what they run: rank 0 imported {first.label()} with suite {first.suite}, "
                    f"rank {rank} imported {seen.label()} with suite {seen.suite}")
    return ""


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())


@contextmanager
def captured_output(path: str) -> Iterator[tuple[int, int]]:
    """File descriptors 1 and 2 (and Python's streams over them) into ``path`` for the block, which gets
    descriptors of the console's stdout and stderr (for what must still reach it: a hang's report)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(path, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            try:
                yield saved
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


def output_tail(path: str) -> str:
    """The last TAIL_LINES lines of ``path`` (within its last OUTPUT_TAIL_BYTES bytes)."""
    try:
        with open(path, "rb") as captured:
            captured.seek(max(0, os.path.getsize(path) - OUTPUT_TAIL_BYTES))
            text = captured.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "".join(text.splitlines(keepends=True)[-TAIL_LINES:])


def launch_world() -> World:
    """The launch's world from the torchrun environment; NativeLaunchError where it cannot be run."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if size > 1 and missing and not os.environ.get("CONFORMANCE_STORE_PORT"):
        raise NativeLaunchError(
            f"--backend native with WORLD_SIZE={size} needs the launcher's {' and '.join(missing)}: start the suite "
            "with torchrun (torchrun --nproc_per_node N -m conformance run --backend native)")
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    if per_machine < 1 or size % per_machine:
        raise NativeLaunchError(f"--backend native: WORLD_SIZE={size} is not a whole number of machines of "
                               f"LOCAL_WORLD_SIZE={per_machine}")
    return World.of(size, machines=size // per_machine)


class NativeBackend:
    """Cases run in-process on ranks another launcher started; one world, the launch's own."""

    name = "native"

    def __init__(self, impl: str, case_timeout: float, agree_timeout: float = AGREE_TIMEOUT_S) -> None:
        self.impl = impl
        #: Called on rank 0 when a case hangs, just before the process ends (the runner writes the reports).
        self.interrupted: Callable[[], None] = lambda: None
        self.case_timeout = case_timeout
        self.agree_timeout = agree_timeout
        self.world = launch_world()
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        # What the rest of the process (and anything it starts) reads as the implementation under test.
        os.environ["ACCELERATE_IMPL"] = impl
        self._store = self._connect() if self.world.size > 1 else None
        self.identity, self.scratch = self._agree()

    @property
    def is_reporter(self) -> bool:
        """Only rank 0 prints and writes reports."""
        return self.rank == 0

    def _connect(self) -> Any:
        from torch.distributed import TCPStore

        port = int(os.environ.get("CONFORMANCE_STORE_PORT") or int(os.environ["MASTER_PORT"]) + 1)
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")
        try:
            return TCPStore(address, port, self.world.size, is_master=self.rank == 0,
                            timeout=timedelta(seconds=self.agree_timeout), wait_for_workers=False)
        except Exception as error:  # torch raises DistStoreError, RuntimeError or TimeoutError by version
            raise NativeLaunchError(f"rank {self.rank}: the suite's store at {address}:{port} did not open: "
                                   f"{_one_line(error)}") from None

    def _agree(self) -> tuple[Identity, str]:
        """Import the implementation, compare every rank's identity on rank 0, share the scratch folder."""
        try:
            mine: Identity | str = import_identity(self.impl)
        except Exception as error:
            mine = _one_line(error)
        scratch = tempfile.mkdtemp(prefix="conformance-native-") if self.rank == 0 else ""
        if self._store is None:
            verdict = disagreement({0: mine})
        else:
            identities = self._gather("hello", mine, what="their implementation's identity")
            verdict = disagreement(identities) if self.rank == 0 else ""
            verdict, scratch = self._from_rank_zero("verdict", (verdict, scratch))
        if verdict:
            if scratch and self.rank == 0:
                shutil.rmtree(scratch, ignore_errors=True)
            raise NativeLaunchError(verdict)
        assert isinstance(mine, Identity)
        os.makedirs(scratch, exist_ok=True)  # another machine's ranks make their own
        return mine, scratch

    def _gather(self, key: str, value: Any, what: str) -> dict[int, Any]:
        """Every rank's ``value`` on rank 0 (others get {}); NativeLaunchError naming the ranks that never came."""
        assert self._store is not None
        self._store.set(f"{key}/{self.rank}", pickle.dumps(value))
        if self.rank != 0:
            return {}
        keys = [f"{key}/{rank}" for rank in range(self.world.size)]
        self._wait(keys, self.agree_timeout, f"ranks {{missing}} did not send {what} within {self.agree_timeout:g} s")
        return {rank: pickle.loads(self._store.get(name)) for rank, name in enumerate(keys)}

    def _from_rank_zero(self, key: str, value: Any) -> Any:
        """Rank 0's ``value`` on every rank; rank 0 returns once every rank has read it."""
        assert self._store is not None
        if self.rank == 0:
            self._store.set(key, pickle.dumps(value))
        else:
            self._wait([key], self.agree_timeout, f"rank 0 did not answer within {self.agree_timeout:g} s")
            value = pickle.loads(self._store.get(key))
        self._store.set(f"{key}-read/{self.rank}", b"1")
        if self.rank == 0:
            keys = [f"{key}-read/{rank}" for rank in range(self.world.size)]
            self._wait(keys, self.agree_timeout, f"ranks {{missing}} did not read rank 0's {key} within {self.agree_timeout:g} s")
        return value

    def _wait(self, keys: list[str], timeout: float, message: str) -> None:
        """Wait for ``keys``; NativeLaunchError with ``message`` (``{missing}``: the ranks not there) on timeout."""
        assert self._store is not None
        try:
            self._store.wait(keys, timedelta(seconds=timeout))
        except Exception:
            missing = [int(key.rpartition("/")[2]) for key in keys if not self._store.check([key])]
            raise NativeLaunchError(f"rank {self.rank}: " + message.format(missing=missing)) from None

    def worlds_supported(self, world: World) -> bool:
        return world == self.world

    def runs(self, case: Case) -> bool:
        """Every case: one about a device family this machine lacks reports NOT_SUPPORTED itself."""
        return True

    def run_world(self, world: World, cases: list[Case], emit: Emit) -> None:
        """Run ``cases`` in lock-step; rank 0 merges every rank's reply and emits the result."""
        output_file = os.path.join(self.scratch, f"output-rank{self.rank}.log")
        for index, case in enumerate(cases):
            shared_dir = os.path.join(self.scratch, f"{index:04d}-{case.name}")
            os.makedirs(shared_dir, exist_ok=True)
            started = time.perf_counter()
            timeout = case.timeout_within(self.case_timeout)
            with captured_output(output_file) as console:
                on_hang = partial(self._hung, index, case, WorldInfo(world, shared_dir), started, output_file, console,
                                  emit)
                watchdog = threading.Timer(timeout, on_hang)
                watchdog.daemon = True
                watchdog.start()
                # The backstop, should the watchdog never get the interpreter (C code holding the GIL).
                faulthandler.dump_traceback_later(timeout + WATCHDOG_GRACE_S, exit=True, file=console[1])
                try:
                    reply = worker.run_case(case.key, world.label, shared_dir)
                finally:
                    faulthandler.cancel_dump_traceback_later()
                    watchdog.cancel()
            reply["output"] = output_tail(output_file)
            replies, missing = self._exchange(index, reply, timeout)
            if self.is_reporter:
                info = WorldInfo(world, shared_dir)
                if missing:
                    status, message = merge_incomplete(replies, missing, Status.HANG, _MISSING_DETAIL)
                else:
                    status, message = merge_replies(case, info, replies)
                output = {rank: r.get("output", "") for rank, r in replies.items()}
                emit(result(case, info, self.name, self.impl, status, message, time.perf_counter() - started,
                            replies, output=output))
            if missing:
                self._end_launch()  # the ranks are out of step: nothing after this case could be trusted

    def _hung(self, index: int, case: Case, info: WorldInfo, started: float, output_file: str,
              console: tuple[int, int], emit: Emit) -> None:
        """The watchdog of a case past its timeout: print every thread's stack on the console; on rank 0, report
        the case (a HANG, or the failure another rank replied with, which explains it); end the launch (a rank
        stuck in a collective cannot be brought back into step)."""
        os.dup2(console[0], 1)
        os.dup2(console[1], 2)
        timeout = case.timeout_within(self.case_timeout)
        say(f"conformance: rank {self.rank}: {case.id} [{case.name}] passed its {timeout:g} s timeout; "
            "every thread's stack:")
        faulthandler.dump_traceback(file=console[1], all_threads=True)
        if self.is_reporter:
            replies, missing = self._replies(index)
            detail = f"the launch ends here (each rank's stack is on its console); {_MISSING_DETAIL}"
            status, message = merge_incomplete(replies, missing, Status.HANG, detail)
            output = {rank: reply.get("output", "") for rank, reply in replies.items()}
            emit(result(case, info, self.name, self.impl, status, message, time.perf_counter() - started, replies,
                        output={**output, 0: output_tail(output_file)}))
        self._end_launch()

    def _end_launch(self) -> NoReturn:
        """End this rank after a hang. Rank 0 has the reports written (``interrupted``) and says so; the others wait
        for that (bounded), so that the launcher, which stops every rank once one exits, does not stop rank 0
        before its reports are written."""
        if self.is_reporter:
            self.interrupted()
            if self._store is not None:
                self._store.set("reported", b"1")
        elif self._store is not None:
            try:
                self._store.wait(["reported"], timedelta(seconds=REPORT_WAIT_S))
            except Exception:
                say(f"conformance: rank {self.rank}: rank 0 wrote no report within {REPORT_WAIT_S:g} s")
        sys.stdout.flush()
        sys.stderr.flush()
        if self.local_rank == 0:
            shutil.rmtree(self.scratch, ignore_errors=True)
        os._exit(HANG_EXIT_STATUS)

    def _exchange(self, index: int, reply: dict[str, Any], timeout: float) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """Every rank's reply on rank 0 (a lock-step barrier for the others), and the ranks that never replied.

        A rank other than 0 that waits in vain (rank 0 or another rank hung) ends the launch.
        """
        if self._store is None:
            return {0: reply}, []
        self._store.set(f"case{index}/{self.rank}", pickle.dumps(reply))
        keys = [f"case{index}/{rank}" for rank in range(self.world.size)]
        try:
            wait = timeout + EXCHANGE_GRACE_S
            self._wait(keys, wait, f"ranks {{missing}} did not finish case {index + 1} within {wait:g} s")
        except NativeLaunchError as error:
            if self.rank != 0:
                say(f"conformance: {error}")
                self._end_launch()
        return self._replies(index)

    def _replies(self, index: int) -> tuple[dict[int, dict[str, Any]], list[int]]:
        """The replies to case ``index`` in the store now, and the ranks that have not replied."""
        if self._store is None:
            return {}, [0]
        keys = {rank: f"case{index}/{rank}" for rank in range(self.world.size)}
        present = {rank: key for rank, key in keys.items() if self._store.check([key])}
        missing = sorted(set(keys) - set(present))
        return {rank: pickle.loads(self._store.get(key)) for rank, key in present.items()}, missing

    def close(self) -> None:
        """Leave together (rank 0 serves the store until every rank has left) and remove the scratch folder."""
        if self._store is not None:
            try:
                self._from_rank_zero("bye", None)
            except NativeLaunchError as error:
                say(f"conformance: at the end of the run: {error}")
        if self.local_rank == 0:
            shutil.rmtree(self.scratch, ignore_errors=True)
