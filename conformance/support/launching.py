"""Starting an implementation's launcher in subprocesses, for the cases of catalog section "Launching".

Each launch runs in a clean environment: the simulated rank's own launch
variables (``RANK``, ``MASTER_PORT``, ``ACCELERATE_*``, the mock device
packages on ``PYTHONPATH``) are removed and ``HF_HOME`` points into the case's
scratch folder, so neither the suite's world nor the user's config leaks into
the launch. Every launch has a timeout; on expiry its whole process group is
killed, so no rank outlives the case.

The implementation's command is forked from a fork server that imported torch
(:data:`CLI_FORK_SERVER`), so a launch does not pay torch's import twice; the
processes it starts itself (the script's ranks) start afresh, as for a user.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator

import filelock

from simulators.forking import ForkedProcess, KeptZygote
from simulators.ports import MACHINE_TMP
from simulators.spawn import signal_quietly

#: Variables of the surrounding launch that a fresh launch must not inherit.
LAUNCH_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
)
#: Seconds one launch may take (startup of torch in every rank on a small, loaded machine).
LAUNCH_TIMEOUT = 150.0
#: The module that runs an implementation's ``accelerate`` command.
CLI_MODULE = "conformance.support.cli_main"
#: The fork server the commands start from, kept from one launch to the next in a rank: it imports torch once.
#: Only torch: an implementation's command modules read the environment at import (``HF_HOME`` and
#: ``XDG_CACHE_HOME`` decide which config file ``launch`` reads, the rule of ``launch.config_location``), so each
#: command imports them itself, as a command started afresh does. Torch reads none of the launch's variables.
CLI_FORK_SERVER = KeptZygote(["torch"])
#: Variables that change from one launch to the next: each command gets them, the fork server is started without.
PER_LAUNCH = ("HF_HOME", "XDG_CACHE_HOME", "HOME", "PROBE_DIR")


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


@dataclass
class Started:
    """A command forked from the launch fork server: its process (which leads its own session and process group)
    and the folder its output goes to (``stdout``, ``stderr``)."""

    process: ForkedProcess
    output: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def start_cli(impl: ModuleType, args: list[str], env: dict[str, str], cwd: str) -> Started:
    """Start ``<impl> <args>`` (the implementation's ``accelerate`` command, :mod:`.cli_main`) with exactly ``env``,
    forked from :data:`CLI_FORK_SERVER`; it ends as a started interpreter does (atexit handlers, then teardown)."""
    output = Path(tempfile.mkdtemp(prefix="accelerate-cli-"))
    server_env = {name: value for name, value in env.items() if name not in PER_LAUNCH}
    process = CLI_FORK_SERVER.lasting(server_env).fork(
        CLI_MODULE, env, output / "stdout", cwd, timeout=LAUNCH_TIMEOUT, args=[impl.name, cli_root(impl), *args],
        error_file=output / "stderr", finalize=True)
    return Started(process, output)


def finish(started: Started, timeout: float = LAUNCH_TIMEOUT) -> Finished:
    """Wait for ``started`` (killing its process group on timeout, with an AssertionError that says so)."""
    try:
        started.process.wait(timeout)
    except subprocess.TimeoutExpired:
        signal_quietly(os.killpg, started.pid)
        raise AssertionError(f"the launch was still running after {timeout:g}s; killed. "
                             f"stderr tail: {_read(started.output / 'stderr')[-800:]}") from None
    finally:
        signal_quietly(os.killpg, started.pid)
    try:
        return Finished(started.process.returncode, _read(started.output / "stdout"), _read(started.output / "stderr"))
    finally:
        shutil.rmtree(started.output, ignore_errors=True)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def run_cli(impl: ModuleType, args: list[str], env: dict[str, str], cwd: str) -> Finished:
    """Run ``<impl> <args>`` to the end."""
    return finish(start_cli(impl, args, env, cwd))


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
