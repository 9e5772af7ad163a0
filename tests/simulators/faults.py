"""The fault catalog (issue 14): ``python -m tests.simulators.faults [--fast]`` (``make faults``).

Each fault makes one rank of a 4-rank world misbehave (the cases are in
:mod:`tests.conformance.fixture_cases.faults`), runs it through the conformance
backend with ``--debug-collectives`` on, and records the status, the time
to the verdict, the diagnosis line that names the culprit, and how many
processes this driver has left afterwards (``psutil``; must be 0). The
last fault SIGKILLs a driver and checks that its ranks and fork server die
with it. Prints the table in Markdown; exits 1 when a fault is not
diagnosed as expected or leaves a process behind.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from unittest import mock

import psutil

from conformance.engine.backends import SimBackend
from simulators import pool
from simulators.flight_recorder import DEBUG_ENV
from simulators.fork_root import FORK_ROOT_ENV
from simulators.topology import LOOPBACK, World
from tests.conformance.fixture_cases import faults as cases

CASE_TIMEOUT = 6.0
WORLD = World.of(4)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def _rendezvous_port_taken() -> Iterator[None]:
    """The pool's rendezvous port is one another socket already listens on."""
    with socket.create_server((LOOPBACK, 0)) as holder:
        with mock.patch("simulators.pool.free_port", return_value=holder.getsockname()[1]):
            yield


@contextlib.contextmanager
def _control_channel_intruders() -> Iterator[None]:
    """Before the ranks start, two strangers connect to the pool's control channel: one silent, one speaking HTTP."""
    intruders: list[socket.socket] = []
    spawn_world = pool.spawn_world

    def spawn_after_intruders(*args, env, **kwargs):
        host, port = env[pool.ADDRESS_ENV].rsplit(":", 1)
        intruders.append(socket.create_connection((host, int(port))))
        intruders.append(socket.create_connection((host, int(port))))
        intruders[-1].sendall(b"GET / HTTP/1.0\r\n\r\n")
        return spawn_world(*args, env=env, **kwargs)

    try:
        with mock.patch("simulators.pool.spawn_world", spawn_after_intruders):
            yield
    finally:
        for intruder in intruders:
            intruder.close()


@dataclass(frozen=True)
class Fault:
    name: str
    case: object
    statuses: tuple[str, ...]
    #: A regular expression the diagnosis must match (it names the culprit or the cause).
    diagnosis: str
    fast: bool = False
    #: Run under --debug-collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL). Off for the skipped-barrier hang:
    #: there DETAIL's own pre-check collective is where ranks block, and the Flight Recorder does not record it.
    debug: bool = True
    arrange: Callable[[], contextlib.AbstractContextManager] = _nothing


FAULTS = (
    Fault("a rank raises", cases.rank_raises, ("ERROR",), r"RuntimeError: rank 1 gave up"),
    Fault("a rank exits 0 early", cases.rank_exits_zero, ("CRASH",), r"rank 1 exit code 0", fast=True),
    Fault("SIGKILL mid-collective", cases.rank_killed_in_collective, ("CRASH",), r"rank 1 signal SIGKILL", fast=True),
    Fault("SIGSTOP", cases.rank_stopped, ("HANG",), r"rank 1: no record|no stack from rank 1"),
    Fault("skips wait_for_everyone", cases.rank_skips_wait_for_everyone, ("HANG",),
          r"gloo:barrier #\d+ entered by ranks 0, 2-3; never joined by rank 1", debug=False),
    Fault("different collectives", cases.ranks_call_different_collectives, ("ERROR", "HANG", "CRASH"),
          r"Detected mismatch between collectives on ranks"),
    Fault("mismatched shapes, ACCELERATE_DEBUG_MODE", cases.mismatched_shapes_debug_mode, ("ERROR", "FAIL"),
          r"Cannot apply desired operation due to shape mismatches"),
    Fault("mismatched shapes", cases.mismatched_shapes, ("ERROR", "FAIL", "HANG", "CRASH"),
          r"Cannot apply desired operation due to shape mismatches|Detected mismatch between collectives"),
    Fault("out of memory", cases.rank_out_of_memory, ("ERROR",), r"DefaultCPUAllocator: can't allocate memory"),
    Fault("rendezvous port taken", cases.rendezvous, ("ERROR", "HANG"), r"EADDRINUSE|timed out",
          arrange=_rendezvous_port_taken),
    Fault("strangers on the control channel", cases.control_channel_intruders, ("PASS",),
          r"refused a connection to the control channel", fast=True, arrange=_control_channel_intruders),
)


@dataclass
class Verdict:
    fault: str
    status: str
    seconds: float
    diagnosis: str
    processes_left: int
    ok: bool


class _Warnings(logging.Handler):
    """The simulator's log lines during one fault (part of its diagnosis)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _descendants() -> set[psutil.Process]:
    """This driver's descendants that still run (zombies not yet reaped count: they are not gone)."""
    return {child for child in psutil.Process().children(recursive=True) if child.is_running()}


def _kept_servers() -> set[psutil.Process]:
    """The root fork server this driver owns, if any, and its bases (one per torch environment, kept for the
    driver's life: a fault that asks for a new environment starts one, and leaves nothing behind by it)."""
    roots = {child for child in psutil.Process().children() if "simulators._fork_root" in child.cmdline()}
    return roots | {base for root in roots for base in root.children()}


def _leftovers(before: set[psutil.Process]) -> set[psutil.Process]:
    """Descendants that still run and did not before a fault: what it left (not, say, the fork server that
    ``simulators.run`` keeps between calls, which an earlier test in this process may have started)."""
    return _descendants() - before - _kept_servers()


def run_fault(fault: Fault) -> Verdict:
    """Run one fault in a fresh backend, close it, and count what is left."""
    before = _descendants()
    backend = SimBackend("accelerate_ref", case_timeout=CASE_TIMEOUT, env=DEBUG_ENV if fault.debug else None)
    warnings = _Warnings()
    logging.getLogger("simulators").addHandler(warnings)
    try:
        with fault.arrange():
            backend._pool(WORLD).start()  # the time to the verdict counts from the case's start, not the ranks'
            result = backend.run_case(fault.case, WORLD)
    finally:
        backend.close()
        logging.getLogger("simulators").removeHandler(warnings)
    text = "\n".join([*warnings.lines, result.message, *result.stacks.values()])
    found = re.search(fault.diagnosis, text)
    line = next((line.strip() for line in text.splitlines() if found and found.group(0) in line), "")
    left = len(_leftovers(before))
    ok = result.status.value in fault.statuses and bool(found) and left == 0
    return Verdict(fault.name, result.status.value, result.duration_s, line or _first(result.message), left, ok)


_DRIVER = textwrap.dedent("""
    import sys
    from conformance.engine.backends import SimBackend
    from simulators.topology import World
    from tests.conformance.fixture_cases import faults
    backend = SimBackend("accelerate_ref", case_timeout=600.0)
    print("running", flush=True)
    backend.run_case(faults.rank_stopped, World.of(4))
""")


def run_driver_killed(timeout: float = 60.0) -> Verdict:
    """SIGKILL a driver whose ranks are up; every process it started must be gone within 5 s."""
    started = time.monotonic()
    before = _descendants()
    # Spawned, not forked from a root fork server, its fork server is its child: the whole tree is seen here.
    env = {name: value for name, value in os.environ.items() if name != FORK_ROOT_ENV}
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert driver.stdout.readline().strip() == "running"
        tree = psutil.Process(driver.pid)
        deadline = time.monotonic() + timeout
        while len(tree.children(recursive=True)) < WORLD.size + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        descendants = tree.children(recursive=True)
        killed_at = time.monotonic()
        driver.kill()
        driver.wait(5.0)
        _, alive = psutil.wait_procs(descendants, timeout=5.0)
        gone_s = time.monotonic() - killed_at
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()
    left = len(alive) + len(_leftovers(before))
    diagnosis = f"{len(descendants)} processes (ranks, fork server) gone {gone_s:.2f} s after the driver's SIGKILL"
    return Verdict("driver SIGKILLed", "KILLED", time.monotonic() - started, diagnosis, left,
                   left == 0 and len(descendants) > WORLD.size)


def table(verdicts: list[Verdict]) -> str:
    rows = ["| fault | status | verdict in | diagnosis | processes left | as expected |", "|---|---|---|---|---|---|"]
    for v in verdicts:
        diagnosis = v.diagnosis.replace("|", "\\|")[:160]
        rows.append(f"| {v.fault} | {v.status} | {v.seconds:.1f} s | {diagnosis} | {v.processes_left} | {'yes' if v.ok else 'NO'} |")
    return "\n".join(rows)


def _first(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulators.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="only the faults `make test` runs")
    args = parser.parse_args(argv)
    verdicts = []
    for fault in FAULTS:
        if fault.fast or not args.fast:
            verdicts.append(run_fault(fault))
            print(f"{verdicts[-1].fault}: {verdicts[-1].status} in {verdicts[-1].seconds:.1f} s", file=sys.stderr)
    if not args.fast:
        verdicts.append(run_driver_killed())
    print(table(verdicts))
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
