"""Starting an implementation's launcher in subprocesses, for the cases of catalog section "Launching".

Each launch runs in a clean environment: the simulated rank's own launch
variables (``RANK``, ``MASTER_PORT``, ``ACCELERATE_*``, the mock device
packages on ``PYTHONPATH``) are removed and ``HF_HOME`` points into the case's
scratch folder, so neither the suite's world nor the user's config leaks into
the launch. Every launch has a timeout; on expiry its whole process group is
killed, so no rank outlives the case.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator

import filelock

from simulators.ports import MACHINE_TMP

#: Variables of the surrounding launch that a fresh launch must not inherit.
LAUNCH_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
)
#: Seconds one launch may take (startup of torch in every rank on a small, loaded machine).
LAUNCH_TIMEOUT = 150.0


def cli_root(impl: ModuleType) -> str:
    """The top package that holds the implementation's ``commands`` (``accelerate``, ``accelerate_ref``, a broken copy)."""
    return impl.Accelerator.__module__.split(".")[0]


def imported_folders(known: list[str]) -> list[str]:
    """Folders this process imports from beyond the interpreter's own and ``known`` (where a vendor's package, the
    project's source or its broken implementations may be found), so that processes it launches import the same;
    never the simulator's mock device sites."""
    return [p for p in sys.path if p and os.path.isdir(p) and p not in known and "devices/sites" not in p
            and not p.startswith((sys.prefix, sys.base_prefix))]


def clean_env(home: str, **extra: str) -> dict[str, str]:
    """This process's environment without launch variables and mock device paths, ``HF_HOME`` at ``home``, and
    ``PYTHONPATH`` naming the folders this process imports from beyond the interpreter's own."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in LAUNCH_VARIABLES and not key.startswith(("ACCELERATE_", "TORCHELASTIC_", "XDG_"))
    }
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and "devices/sites" not in p]
    env["PYTHONPATH"] = os.pathsep.join(paths + imported_folders(paths))
    env["HF_HOME"] = home
    # The implementation's console scripts (``accelerate test`` runs ``accelerate-launch``) are found
    # on PATH, as they are for a user who installed it.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


@dataclass
class Finished:
    """A finished command: exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def start_cli(impl: ModuleType, args: list[str], env: dict[str, str], cwd: str, stdin: str | None = None) -> subprocess.Popen:
    """Start ``<impl> <args>`` (the implementation's ``accelerate`` command) in its own process group."""
    code = (
        "import importlib, sys; importlib.import_module(sys.argv.pop(1)).Accelerator; "
        "cli = importlib.import_module(sys.argv.pop(1) + '.commands.accelerate_cli'); "
        "sys.argv[0] = 'accelerate'; sys.exit(cli.main())"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, impl.name, cli_root(impl), *args],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, text=True, start_new_session=True,
    )


def finish(process: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT, stdin: str | None = None) -> Finished:
    """Wait for ``process`` (killing its process group on timeout, with an AssertionError that says so)."""
    try:
        out, err = process.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        out, err = process.communicate()
        raise AssertionError(f"the launch was still running after {timeout:g}s; killed. stderr tail: {err[-800:]}")
    finally:
        _kill_group(process)
    return Finished(process.returncode, out, err)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_cli(impl: ModuleType, args: list[str], env: dict[str, str], cwd: str, stdin: str | None = None) -> Finished:
    """Run ``<impl> <args>`` to the end."""
    return finish(start_cli(impl, args, env, cwd, stdin), stdin=stdin)


def write_probe(folder: str, impl: ModuleType) -> str:
    """A training-free script that records, per rank, what the launched process sees; returns its path.

    Each rank writes ``report-<RANK>-<pid>.json`` into ``$PROBE_DIR``: the launch variables, and the
    Accelerator's distributed type, process counts, indices and mixed precision; then it waits for the others
    (a rank that exits at once can close a pair its peer is still connecting: gloo's "Connection closed by peer").
    """
    path = os.path.join(folder, "probe.py")
    with open(path, "w") as handle:
        handle.write(textwrap.dedent(f"""\
            import importlib, json, os, sys
            impl = importlib.import_module({impl.name!r})
            acc = impl.Accelerator()
            report = dict(
                env={{k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU")}},
                distributed_type=str(getattr(acc.distributed_type, "value", acc.distributed_type)),
                num_processes=acc.num_processes, process_index=acc.process_index,
                local_process_index=acc.local_process_index, is_local_main_process=acc.is_local_main_process,
                mixed_precision=str(acc.mixed_precision), argv=sys.argv[1:], pid=os.getpid(),
            )
            name = f"report-{{os.environ.get('RANK', 'none')}}-{{os.getpid()}}.json"
            with open(os.path.join(os.environ["PROBE_DIR"], name), "w") as out:
                json.dump(report, out)
            acc.wait_for_everyone()  # no rank exits while another still completes gloo's connection handshake
            """))
    return path


def read_reports(folder: str) -> list[dict]:
    """The probe reports in ``folder``, by process index."""
    reports = []
    for name in glob.glob(os.path.join(folder, "report-*.json")):
        with open(name) as handle:
            reports.append(json.load(handle))
    return sorted(reports, key=lambda r: (r["process_index"], r["pid"]))


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` still runs (zombies of other parents count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


#: The port HF 1.15's ``debug_launcher`` (and the reference's, as HF's) always rendezvous on: it takes no port.
DEBUG_LAUNCHER_PORT = 29500


@contextlib.contextmanager
def holding_port(port: int, timeout: float) -> Iterator[None]:
    """Hold a lock on this machine named after ``port`` while a launcher that cannot be given another port runs.

    Two suite runs side by side (the reference's and HF's, as the project's tests run them) would otherwise
    start their ``debug_launcher`` ranks on the same port at once, and the later gloo rendezvous fails. The lock
    lives in the machine's temporary folder (``MACHINE_TMP``), not ``$TMPDIR``: each simulated run gives its ranks
    a ``TMPDIR`` of their own, where two runs' locks would never meet. Waiting
    longer than ``timeout`` seconds is a TimeoutError naming the lock."""
    lock = filelock.FileLock(os.path.join(MACHINE_TMP, f"conformance-port-{port}.lock"))
    try:
        lock.acquire(timeout=timeout)
    except filelock.Timeout:
        raise TimeoutError(f"port {port} stayed reserved by another run for {timeout:.0f} s (lock {lock.lock_file})") from None
    try:
        yield
    finally:
        lock.release()
