"""Catalog section "Launching" (and ``config.write_basic_config``).

The launch cases start the implementation's own command line (its
``commands.accelerate_cli``, the ``accelerate`` command) in subprocesses from
rank 0 of the world the catalog names, the other ranks idle; the launched
ranks run a probe script (``conformance.support.launching.write_probe``) that records
what each process sees. ``launch.multi_node`` starts two launchers, one per
simulated machine, on this host. Every launch has a timeout and its process
group is killed after it, so no rank outlives a case.

``logging.get_logger`` and ``launch.distributed_type_branch`` run on the
suite's own ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import types
from contextlib import contextmanager

import yaml

from simulators.forking import running
from simulators.ports import free_port

from ..engine.case import ANY_WORLD, case
from ..support import spellings
from ..support.checks import expect_equal, expect_raises, expect_true
from ..support.launching import DEBUG_LAUNCHER_PORT, LAUNCH_TIMEOUT, clean_env, holding_port, finish, read_reports, run_cli, start_cli, write_probe

#: Seconds a launch case may take (several launches of torch processes on a small machine).
LAUNCH_CASE_TIMEOUT = 300.0


def _folders(world, name: str) -> tuple[str, str]:
    """A scratch folder for this launch and a ``HF_HOME`` inside it."""
    folder = os.path.join(world.shared_dir, name)
    os.makedirs(os.path.join(folder, "probe"), exist_ok=True)
    return folder, os.path.join(folder, "hf_home")


def _launch_probe(impl, world, name: str, flags: list[str], **env: str) -> tuple[list[dict], object]:
    """Launch the probe script with ``flags``; the reports of this launch's processes (and no earlier one's)."""
    folder, home = _folders(world, name)
    script = write_probe(folder, impl)
    probe_dir = tempfile.mkdtemp(prefix="probe-", dir=folder)
    done = run_cli(impl, ["launch", *flags, script, "--probe-arg", "7"], clean_env(home, PROBE_DIR=probe_dir, **env), folder)
    expect_equal(done.returncode, 0, f"exit status of `launch {' '.join(flags)}` (stderr tail: {done.stderr[-600:]!r})")
    return read_reports(probe_dir), done


def _write_yaml(path: str, values: dict) -> str:
    """A config file of ``values``, with the keys of the run's level (``spellings.config_file``)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        yaml.safe_dump(spellings.config_file(values), handle)
    return path


#: A config file as 🤗 Accelerate's `accelerate config` writes it for a multi-GPU machine (all its keys).
MULTI_DEVICE_CONFIG = {
    "compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "MULTI_GPU",
    "downcast_bf16": "no", "enable_cpu_affinity": False, "gpu_ids": "all", "machine_rank": 0,
    "main_training_function": "main", "mixed_precision": "bf16", "num_machines": 1, "num_processes": 1,
    "rdzv_backend": "static", "same_network": True, "tpu_env": [], "tpu_use_cluster": False,
    "tpu_use_sudo": False, "use_cpu": False,
}

#: The file 🤗 Accelerate 1.15's `write_basic_config("bf16", path)` writes on a CPU-only machine (JSON, which is YAML).
HF_BASIC_CONFIG = """{
  "compute_environment": "LOCAL_MACHINE",
  "debug": false,
  "distributed_type": "NO",
  "downcast_bf16": false,
  "enable_cpu_affinity": false,
  "machine_rank": 0,
  "main_training_function": "main",
  "mixed_precision": "bf16",
  "num_machines": 1,
  "num_processes": 1,
  "rdzv_backend": "static",
  "same_network": false,
  "tpu_use_cluster": false,
  "tpu_use_sudo": false,
  "use_cpu": true
}
"""


@case("launch.cli", worlds=[2], timeout=LAUNCH_CASE_TIMEOUT)
def launch_cli(impl, world):
    """``launch --config_file f --num_processes 2 script args`` runs the script on 2 ranks with its arguments;
    the file's ``mixed_precision`` is honoured and the ``--num_processes`` flag overrides the file's 1."""
    if world.rank != 0:
        return
    folder, _ = _folders(world, "cli")
    config = _write_yaml(os.path.join(folder, "config.yaml"), MULTI_DEVICE_CONFIG)
    reports, _ = _launch_probe(impl, world, "cli", ["--config_file", config, "--num_processes", "2", "--main_process_port", str(free_port())])
    expect_equal(sorted(r["env"]["RANK"] for r in reports), ["0", "1"], "RANK of the processes started (flag -n 2 over the file's 1)")
    expect_equal({r["env"]["WORLD_SIZE"] for r in reports}, {"2"}, "WORLD_SIZE seen by the ranks")
    expect_equal({r["mixed_precision"] for r in reports}, {"bf16"}, "mixed_precision from the config file")
    expect_equal({tuple(r["argv"]) for r in reports}, {("--probe-arg", "7")}, "script arguments passed through")


@case("launch.cpu_ranks", worlds=[2, 4], timeout=LAUNCH_CASE_TIMEOUT)
def launch_cpu_ranks(impl, world):
    """``launch --cpu --num_processes N`` starts N gloo ranks that see MULTI_CPU and ``num_processes == N``
    (accelerate issue #2741: a single process)."""
    if world.rank != 0:
        return
    n = world.size
    reports, _ = _launch_probe(impl, world, "cpu", ["--cpu", "--num_processes", str(n)])
    expect_equal(len(reports), n, f"processes started by --cpu --num_processes {n}")
    expect_equal([r["process_index"] for r in reports], list(range(n)), "process_index of the ranks")
    expect_equal({(r["distributed_type"], r["num_processes"]) for r in reports}, {("MULTI_CPU", n)}, "(distributed_type, num_processes) on every rank")


@case("launch.multi_node", worlds=["2x2"], timeout=LAUNCH_CASE_TIMEOUT)
def launch_multi_node(impl, world):
    """Two ``launch --cpu --num_processes 4 --num_machines 2 --machine_rank r --main_process_ip 127.0.0.1
    --main_process_port p`` on one host form one world of 4: machine r runs ranks 2r and 2r+1, with
    local indices 0 and 1 and the local main process at local index 0."""
    if world.rank != 0:
        return
    folder, home = _folders(world, "multi_node")
    script = write_probe(folder, impl)
    port = str(free_port())
    launchers = []
    for machine in (0, 1):
        probe_dir = os.path.join(folder, f"machine{machine}")
        os.makedirs(probe_dir, exist_ok=True)
        flags = ["launch", "--cpu", "--num_processes", "4", "--num_machines", "2", "--machine_rank", str(machine),
                 "--main_process_ip", "127.0.0.1", "--main_process_port", port, script]
        launchers.append(start_cli(impl, flags, clean_env(home, PROBE_DIR=probe_dir), folder))
    finished = [finish(process) for process in launchers]
    for machine, done in enumerate(finished):
        expect_equal(done.returncode, 0, f"exit status of machine {machine}'s launcher (stderr tail: {done.stderr[-600:]!r})")
    for machine in (0, 1):
        seen = [
            (r["process_index"], r["local_process_index"], r["is_local_main_process"], r["num_processes"])
            for r in read_reports(os.path.join(folder, f"machine{machine}"))
        ]
        expected = [(2 * machine + local, local, local == 0, 4) for local in (0, 1)]
        expect_equal(seen, expected, f"(process_index, local_process_index, is_local_main_process, num_processes) on machine {machine}")


FAILING_SCRIPT = """\
import os, sys, time
rank = int(os.environ.get("RANK", "0"))
open(os.path.join(os.environ["PROBE_DIR"], f"pid-{rank}"), "w").write(str(os.getpid()))
if rank == 1:
    while not os.path.exists(os.path.join(os.environ["PROBE_DIR"], "pid-0")):
        time.sleep(0.05)
    raise RuntimeError("conformance-failure-marker")
time.sleep(120)
"""


@case("launch.failure", worlds=[2], timeout=LAUNCH_CASE_TIMEOUT)
def launch_failure(impl, world):
    """A rank that raises ends the whole launch (the other rank sleeps 120 s) with a non-zero exit, that
    rank's traceback shown, and no rank left running."""
    if world.rank != 0:
        return
    folder, home = _folders(world, "failure")
    script = os.path.join(folder, "fails.py")
    with open(script, "w") as handle:
        handle.write(FAILING_SCRIPT)
    probe_dir = os.path.join(folder, "probe")
    started = time.monotonic()
    done = run_cli(impl, ["launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", str(free_port()), script],
                   clean_env(home, PROBE_DIR=probe_dir), folder)
    elapsed = time.monotonic() - started
    expect_true(done.returncode != 0, f"the launch of a failing rank should exit non-zero, got {done.returncode}")
    expect_true("conformance-failure-marker" in done.stderr, f"the failing rank's traceback should be shown; stderr tail: {done.stderr[-600:]!r}")
    expect_true(elapsed < 100, f"the launch took {elapsed:.0f}s: the surviving rank was not stopped")
    pids = [int(open(os.path.join(probe_dir, name)).read()) for name in os.listdir(probe_dir) if name.startswith("pid-")]
    expect_equal(len(pids), 2, "ranks that started")
    time.sleep(0.5)
    expect_equal([pid for pid in pids if running(pid)], [], "ranks still running after the launch ended")


@case("launch.config_location", worlds=[1], timeout=LAUNCH_CASE_TIMEOUT)
def launch_config_location(impl, world):
    """With no ``--config_file``, ``launch`` reads ``default_config.yaml`` from ``$HF_HOME/accelerate``, else
    ``$XDG_CACHE_HOME/huggingface/accelerate``, else ``~/.cache/huggingface/accelerate``."""
    folder, _ = _folders(world, "location")
    places = {
        "HF_HOME": ({"HF_HOME": os.path.join(folder, "hf")}, os.path.join(folder, "hf", "accelerate")),
        "XDG_CACHE_HOME": ({"HF_HOME": None, "XDG_CACHE_HOME": os.path.join(folder, "xdg")}, os.path.join(folder, "xdg", "huggingface", "accelerate")),
        "HOME": ({"HF_HOME": None, "HOME": os.path.join(folder, "home")}, os.path.join(folder, "home", ".cache", "huggingface", "accelerate")),
    }
    for rule, (env, config_dir) in places.items():
        _write_yaml(os.path.join(config_dir, "default_config.yaml"), dict(MULTI_DEVICE_CONFIG, distributed_type="NO", mixed_precision="bf16"))
        # One process pinned, whatever the machine's accelerators: the case counts the processes' reports.
        reports, _ = _launch_probe(impl, world, f"location-{rule}", ["--num_processes", "1"], **env)
        expect_equal([r["mixed_precision"] for r in reports], ["bf16"], f"mixed_precision read from the default config found by {rule}")


@case("launch.config_file", worlds=[1], timeout=LAUNCH_CASE_TIMEOUT)
def launch_config_file(impl, world):
    """``config default --config_file f --mixed_precision bf16`` writes a YAML file that ``launch --config_file f``
    reads; a config written by 🤗 Accelerate (its ``write_basic_config`` output) is read the same way."""
    folder, home = _folders(world, "config_file")
    written = os.path.join(folder, "written.yaml")
    done = run_cli(impl, ["config", "default", "--config_file", written, "--mixed_precision", "bf16"], clean_env(home), folder)
    expect_equal(done.returncode, 0, f"exit status of `config default` (stderr: {done.stderr[-400:]!r})")
    with open(written) as handle:
        values = yaml.safe_load(handle)
    expect_equal((values.get("compute_environment"), values.get("mixed_precision")), ("LOCAL_MACHINE", "bf16"), "keys of the written config")
    hf_written = os.path.join(folder, "hf_written.yaml")
    with open(hf_written, "w") as handle:
        handle.write(spellings.config_text(HF_BASIC_CONFIG))
    for path in (written, hf_written):
        reports, _ = _launch_probe(impl, world, f"read-{os.path.basename(path)}", ["--config_file", path])
        expect_equal([r["mixed_precision"] for r in reports], ["bf16"], f"mixed_precision launched from {os.path.basename(path)}")


@case("config.write_basic_config", worlds=[1], timeout=LAUNCH_CASE_TIMEOUT)
def config_write_basic_config(impl, world):
    """``write_basic_config(mixed_precision, save_location)`` writes a config at ``save_location`` that the
    launcher reads back; a second call does not overwrite it."""
    folder, _ = _folders(world, "basic")
    path = os.path.join(folder, "nested", "basic.yaml")
    impl.utils.write_basic_config(mixed_precision="bf16", save_location=path)
    with open(path) as handle:
        first = handle.read()
    expect_equal(yaml.safe_load(first).get("mixed_precision"), "bf16", "mixed_precision in the written config")
    again = impl.utils.write_basic_config(mixed_precision="fp16", save_location=path)
    with open(path) as handle:
        expect_equal(handle.read(), first, "the config after a second write_basic_config (must not be overwritten)")
    expect_true(not again, f"a refused write_basic_config should return a false value, got {again!r}")
    reports, _ = _launch_probe(impl, world, "basic-launch", ["--config_file", path])
    expect_equal([r["mixed_precision"] for r in reports], ["bf16"], "mixed_precision launched from the written config")


@case("launch.env", worlds=[1], timeout=LAUNCH_CASE_TIMEOUT)
def launch_env(impl, world):
    """``env`` prints the platform, Python, torch and implementation versions and the active config."""
    import platform

    import torch

    folder, home = _folders(world, "env")
    _write_yaml(os.path.join(home, "accelerate", "default_config.yaml"), dict(MULTI_DEVICE_CONFIG, mixed_precision="fp16", main_training_function="conformance_marker_fn"))
    done = run_cli(impl, ["env"], clean_env(home), folder)
    expect_equal(done.returncode, 0, f"exit status of `env` (stderr: {done.stderr[-400:]!r})")
    wanted = {
        "platform": platform.platform(), "Python version": platform.python_version(),
        "torch version": torch.__version__, "implementation version": impl.version,
        "active config": "conformance_marker_fn",
    }
    missing = [f"{what} ({text!r})" for what, text in wanted.items() if text not in done.stdout]
    expect_equal(missing, [], f"what `env` should print; it printed: {done.stdout[-1200:]!r}")


@case("launch.test", worlds=[2], timeout=LAUNCH_CASE_TIMEOUT)
def launch_test(impl, world):
    """``test`` runs a short distributed self-check, reports success and exits 0."""
    if world.rank != 0:
        return
    folder, home = _folders(world, "selftest")
    done = run_cli(impl, ["test"], clean_env(home), folder)
    expect_equal(done.returncode, 0, f"exit status of `test` (output tail: {(done.stdout + done.stderr)[-800:]!r})")
    expect_true("success" in done.stdout.lower(), f"`test` should report success; stdout tail: {done.stdout[-600:]!r}")


NOTEBOOK_SCRIPT = """\
import importlib, json, os, sys
impl = importlib.import_module(sys.argv[1])

def training_function(tag):
    acc = impl.Accelerator()
    dtype = str(getattr(acc.distributed_type, "value", acc.distributed_type))
    with open(os.path.join(os.environ["PROBE_DIR"], f"{tag}-{os.getpid()}.json"), "w") as out:
        json.dump([acc.process_index, acc.num_processes, dtype, os.getppid()], out)
    # Every rank waits for the others before fn returns: a rank whose process ends at once can close a gloo pair
    # its peer is still connecting ("Connection closed by peer" in ProcessGroupGloo's construction).
    acc.wait_for_everyone()

if __name__ == "__main__":
    launcher = sys.argv[2]
    if launcher == "notebook":
        impl.notebook_launcher(training_function, ("notebook",), num_processes=2, use_port=sys.argv[3])
        impl.Accelerator()
        try:
            impl.notebook_launcher(training_function, ("late",), num_processes=2, use_port=sys.argv[3])
        except Exception as error:
            print("REFUSED", type(error).__name__, error)
    else:
        impl.debug_launcher(training_function, ("debug",), num_processes=2)
    print("PARENT", os.getpid())
"""


def _run_in_notebook(impl, world, launcher: str) -> tuple[list, object]:
    folder, home = _folders(world, launcher)
    script = os.path.join(folder, "notebook.py")
    with open(script, "w") as handle:
        handle.write(NOTEBOOK_SCRIPT)
    probe_dir = os.path.join(folder, "probe")
    # debug_launcher takes no port: one run on its port at a time on this machine.
    with holding_port(DEBUG_LAUNCHER_PORT, LAUNCH_TIMEOUT) if launcher == "debug" else contextlib.nullcontext():
        done = subprocess.run([sys.executable, script, impl.name, launcher, str(free_port())], env=clean_env(home, PROBE_DIR=probe_dir),
                              cwd=folder, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    expect_equal(done.returncode, 0, f"exit status of the notebook process (stderr tail: {done.stderr[-600:]!r})")
    records = []
    for name in sorted(os.listdir(probe_dir)):
        with open(os.path.join(probe_dir, name)) as handle:
            records.append((name.split("-")[0], *json.load(handle)))
    return records, done


@case("launch.notebook_launcher", worlds=[2], timeout=LAUNCH_CASE_TIMEOUT)
def launch_notebook_launcher(impl, world):
    """``notebook_launcher(fn, args, num_processes=2)`` runs ``fn`` on 2 ranks forked from one Python process,
    the Accelerator created inside ``fn``; called after an Accelerator exists, it refuses with an error that
    names the Accelerator, and runs nothing."""
    if world.rank != 0:
        return
    records, done = _run_in_notebook(impl, world, "notebook")
    ran = sorted((tag, index, count) for tag, index, count, _, _ in records)
    expect_equal(ran, [("notebook", 0, 2), ("notebook", 1, 2)], "(tag, process_index, num_processes) of the runs of fn")
    refusal = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    expect_true(bool(refusal) and "Accelerator" in refusal[0], f"a launch after an Accelerator exists should be refused naming it; stdout: {done.stdout[-600:]!r}")


@case("launch.debug_launcher", worlds=[2], timeout=LAUNCH_CASE_TIMEOUT)
def launch_debug_launcher(impl, world):
    """``debug_launcher(fn, num_processes=2)`` runs ``fn`` on 2 CPU ranks (MULTI_CPU) for debugging."""
    if world.rank != 0:
        return
    records, _ = _run_in_notebook(impl, world, "debug")
    ran = sorted((tag, index, count, dtype) for tag, index, count, dtype, _ in records)
    expect_equal(ran, [("debug", 0, 2, "MULTI_CPU"), ("debug", 1, 2, "MULTI_CPU")], "(tag, process_index, num_processes, distributed_type) of the runs of fn")


@case("launch.distributed_type_branch", worlds=[w for w in ANY_WORLD if w != "1"], timeout=LAUNCH_CASE_TIMEOUT)
def launch_distributed_type_branch(impl, world):
    """``accelerator.distributed_type`` is a ``DistributedType`` member a script can branch on: the XLA
    (TPU) member exactly when the device is an XLA device, so static-shape code paths are taken there only.

    Not at world 1: there HF reports XLA on a single XLA replica and the reference NO (its rule in
    ``tests/simulators/devices/test_xla.py``); which one the documents mean is open."""
    acc = impl.Accelerator()
    kind = acc.distributed_type
    expect_true(isinstance(kind, impl.DistributedType), f"distributed_type {kind!r} should be a DistributedType member")
    xla = getattr(impl.DistributedType, "XLA", None) or impl.DistributedType.TPU
    expect_equal(kind == xla, acc.device.type == "xla", f"distributed_type == XLA (device {acc.device})")


class _FileHandler(logging.Handler):
    """Appends each record's message to a file shared by every rank, flushing at once."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        with open(self.path, "a") as handle:
            handle.write(record.getMessage().split("] ")[-1] + "\n")


@case("logging.get_logger", worlds=[2], timeout=60)
def logging_get_logger(impl, world):
    """``get_logger(name)`` logs on the main process only; ``main_process_only=False`` on every rank;
    ``in_order=True`` on every rank in rank order (rank 0 is delayed, so an unordered log shows rank 1 first)."""
    import importlib

    get_logger = importlib.import_module(f"{impl.Accelerator.__module__.split('.')[0]}.logging").get_logger
    acc = impl.Accelerator()
    name = f"conformance.support.launching.{os.path.basename(world.shared_dir)}"
    handler = _FileHandler(os.path.join(world.shared_dir, "log.txt"))
    base = logging.getLogger(name)
    base.addHandler(handler)
    base.propagate = False
    try:
        logger = get_logger(name, log_level="INFO")
        logger.info(f"main-only {acc.process_index}")
        logger.info(f"every {acc.process_index}", main_process_only=False)
        acc.wait_for_everyone()
        if acc.process_index == 0:
            time.sleep(1.0)
        logger.info(f"ordered {acc.process_index}", main_process_only=False, in_order=True)
        acc.wait_for_everyone()
    finally:
        base.removeHandler(handler)
    if acc.process_index == 0:
        with open(handler.path) as handle:
            return handle.read().splitlines()


@logging_get_logger.check
def _logging_get_logger_check(values, world):
    lines = values[0]
    text = " | ".join(lines)
    expect_equal(sorted(line for line in lines if line.startswith("main-only")), ["main-only 0"], f"default (main process only) log lines in {text!r}")
    expect_equal(sorted(line for line in lines if line.startswith("every")), ["every 0", "every 1"], "main_process_only=False log lines")
    expect_equal([line for line in lines if line.startswith("ordered")], ["ordered 0", "ordered 1"], "in_order=True log lines, in file order")


@contextmanager
def _recorded_subprocess_runs(calls: list):
    original = subprocess.run
    subprocess.run = lambda command, *args, **kwargs: calls.append(list(command))
    try:
        yield
    finally:
        subprocess.run = original


@contextmanager
def _colab(active: bool):
    saved = sys.modules.get("IPython")
    if active:
        fake = types.ModuleType("IPython")
        fake.get_ipython = lambda: "<google.colab._shell.Shell object>"
        sys.modules["IPython"] = fake
    else:
        sys.modules.pop("IPython", None)
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["IPython"] = saved
        else:
            sys.modules.pop("IPython", None)


@case("xla.install_xla", worlds=[1])
def xla_install_xla(impl, world):
    """``install_xla(upgrade=...)`` in Colab runs pip for the torch_xla wheel of the installed torch's
    ``major.minor`` (after upgrading torch when ``upgrade=True``); elsewhere it says so (an error) and runs nothing."""
    import importlib.metadata

    version = importlib.metadata.version("torch").split("+")[0]
    major_minor = version[: version.rindex(".")]
    calls: list = []
    with _recorded_subprocess_runs(calls), _colab(False):
        expect_raises(impl.utils.install_xla, RuntimeError, "install_xla outside Colab")
    expect_equal(calls, [], "commands run by install_xla outside Colab")
    for upgrade in (False, True):
        calls = []
        with _recorded_subprocess_runs(calls), _colab(True):
            impl.utils.install_xla(upgrade=upgrade)
        wheels = [c for c in calls if c[:2] == ["pip", "install"] and any(f"torch_xla-{major_minor}" in part for part in c)]
        expect_equal(len(wheels), 1, f"pip commands for the torch_xla {major_minor} wheel (upgrade={upgrade}); ran {calls}")
        upgrades = [c for c in calls if c[:2] == ["pip", "install"] and "-U" in c and "torch" in c]
        expect_equal(len(upgrades), int(upgrade), f"torch upgrade commands with upgrade={upgrade}; ran {calls}")
