"""The root fork server: a process forked from it observes what a spawned one observes; it forks only where a fresh
interpreter would import the same files and read the same settings; nothing it forks outlives its asker."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simulators._fork_root import (READ_AT_IMPORT, READ_AT_RUN_TIME, READ_BY_PYTHON, READ_WITH_TORCH, WITH_TORCH,
                                   shadowed)
from simulators.devices import world_settings
from simulators.devices.memory.peaks import REPORT_DIR_ENV, memory_report_path
from simulators.fork_root import FORK_ROOT_ENV, ForkRoot, RootChild, run_module, start_module
from tests.processes import still_running

REPO = Path(__file__).resolve().parents[2]
PROBE = "tests.simulators.process_probe"


@pytest.fixture
def own_root():
    """A root of the test's own, whose first request forks its first base."""
    with ForkRoot() as owned:
        yield owned


@pytest.fixture
def root(fork_root, request):
    """The test process's root (``tests/conftest.py``), whose bases the other tests' children share, or a root of
    the test's own where the tests run without one."""
    yield fork_root if fork_root is not None else request.getfixturevalue("own_root")


def start_probe(env: dict, folder: Path, code: int = 0, *extra: str, cwd: Path = REPO):
    """The probe started with ``env`` (from the root it names, if any), its stdout and stderr in ``folder``."""
    out, err = folder / "out", folder / "err"
    with open(os.devnull, "rb") as stdin, open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = start_module(PROBE, [str(code), *extra], env, stdin=stdin.fileno(), stdout=stdout.fileno(),
                               stderr=stderr.fileno(), cwd=str(cwd))
    return process, out, err


def probe(env: dict, folder: Path, code: int = 0) -> tuple[object, int, dict, str]:
    folder.mkdir()
    process, out, err = start_probe(env, folder, code)
    returncode = process.wait(60)
    return process, returncode, json.loads(out.read_text()), err.read_text()


def test_a_module_forked_from_the_root_observes_what_a_spawned_one_does(root, tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}/extra{os.pathsep}relative", "OMP_NUM_THREADS": "1",
           FORK_ROOT_ENV: root.socket_path}
    spawned_env = {name: value for name, value in env.items() if name != FORK_ROOT_ENV}
    spawned, spawned_code, expected, spawned_err = probe(spawned_env, tmp_path / "spawned", code=3)
    forked, forked_code, seen, forked_err = probe(env, tmp_path / "forked", code=3)
    assert isinstance(spawned, subprocess.Popen) and isinstance(forked, RootChild), (spawned, forked)
    assert seen["parent"] not in (os.getpid(), root.pid), "forked from a base, not spawned by this process"
    assert forked_code == spawned_code == 3
    assert forked_err == spawned_err == "to stderr\n"
    assert seen["env"] == {**expected["env"], FORK_ROOT_ENV: root.socket_path}
    for key in ("argv", "path", "cwd", "streams", "tempdir", "torch_threads",
                "session_leader"):
        assert seen[key] == expected[key], f"{key}: forked {seen[key]!r}, spawned {expected[key]!r}"
    _, _, again, _ = probe(env, tmp_path / "again")
    assert again["numpy_draw"] != seen["numpy_draw"], "each forked process draws its own numpy random stream"
    assert again["parent"] == seen["parent"], "one base serves one torch environment"


def test_another_torch_environment_gets_its_own_base(root, tmp_path):
    env = {**os.environ, FORK_ROOT_ENV: root.socket_path}
    _, _, one_thread, _ = probe({**env, "OMP_NUM_THREADS": "1"}, tmp_path / "one")
    _, _, two_threads, _ = probe({**env, "OMP_NUM_THREADS": "2"}, tmp_path / "two")
    assert (one_thread["torch_threads"], two_threads["torch_threads"]) == (1, 2)
    assert one_thread["parent"] != two_threads["parent"], "torch read OMP_NUM_THREADS at import: another base"
    _, _, run_time_only, _ = probe({**env, "OMP_NUM_THREADS": "1", **dict.fromkeys(READ_AT_RUN_TIME, "7")},
                                   tmp_path / "run-time")
    assert run_time_only["parent"] == one_thread["parent"], "torch reads these at run time only: the same base"
    assert all(run_time_only["env"][name] == "7" for name in READ_AT_RUN_TIME), "each child has its own values"


def test_a_process_with_a_mock_gpu_on_its_path_forks_from_a_base_that_loaded_it_first(root, tmp_path):
    """torch loads a ``torch.backends`` entry point (the mock GPU's site) at ``import torch``, before any module
    can capture ``torch.cuda``'s functions; torch._dynamo's device interface captures them when imported. A child
    with the mock on its path sees it through dynamo, as a spawned process does: its base imported the mock's
    module before dynamo. What the launch's environment asks of the mock (memory reports) is the entry point's
    call, made in each child: a child whose launch asks for reports writes one, from the base that served a launch
    that did not."""
    settings = world_settings("cuda")
    env = {**os.environ, **settings.env, "PYTHONPATH": os.pathsep.join(settings.pythonpath), "PROBE_CUDA": "1",
           FORK_ROOT_ENV: root.socket_path}
    spawned_env = {name: value for name, value in env.items() if name != FORK_ROOT_ENV}
    spawned, _, expected, _ = probe(spawned_env, tmp_path / "spawned")
    forked, _, seen, _ = probe(env, tmp_path / "forked")
    assert isinstance(spawned, subprocess.Popen) and isinstance(forked, RootChild), (spawned, forked)
    assert expected["cuda"]["dynamo_devices"] == expected["cuda"]["devices"] > 0, expected["cuda"]
    assert seen["cuda"] == expected["cuda"], f"forked {seen['cuda']}, spawned {expected['cuda']}"
    reports = tmp_path / "reports"
    reports.mkdir()
    _, _, reporting, _ = probe({**env, REPORT_DIR_ENV: str(reports)}, tmp_path / "reporting")
    assert reporting["parent"] == seen["parent"], "the report folder is the child's own setting: the same base"
    assert [path.name for path in reports.iterdir()] == [Path(memory_report_path(str(reports), 0)).name], \
        "the child whose launch asked for memory reports wrote none"
    _, _, plain, _ = probe({**os.environ, "PROBE_CUDA": "1", FORK_ROOT_ENV: root.socket_path}, tmp_path / "plain")
    assert plain["cuda"]["devices"] == 0 and plain["parent"] != seen["parent"], "another set of backends: another base"


@pytest.mark.parametrize("family", ["cuda", "npu"])
def test_the_bases_key_holds_every_variable_their_extra_imports_read(family):
    """A fresh interpreter records every variable read while it imports torch, then what a base imports after torch
    (the mock ``family``'s module, as the base for a path with its site does, then ``WITH_TORCH``): each read after
    torch must be one a base is keyed on (or one Python's start-up settings, which must equal the root's, cover), and
    none of all those imports reads by its name one the key leaves to run time (``READ_AT_RUN_TIME``, set here; tqdm,
    which torch imports, walks every variable for its own prefix)."""
    recorder = textwrap.dedent("""
        import json, os, sys
        read, by_name = set(), set()

        class Recording(os._Environ):
            def __getitem__(self, key):
                read.add(key)
                if sys._getframe(1).f_code.co_name != "__iter__":  # not a walk over every variable
                    by_name.add(key)
                return super().__getitem__(key)

            def __contains__(self, key):
                read.add(key)
                by_name.add(key)
                return super().__contains__(key)

        environ = os.environ
        os.environ = Recording(environ._data, environ.encodekey, environ.decodekey, environ.encodevalue,
                               environ.decodevalue)
        import torch
        from simulators._fork_root import base_imports
        read.clear()
        imports = base_imports((sys.argv[1],))
        for module in imports:
            __import__(module)
        os.environ = environ
        print(json.dumps([imports, sorted(read), sorted(by_name)]))
        """)
    site = world_settings(family).pythonpath[0]
    env = {**os.environ, "PYTHONPATH": site, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **dict.fromkeys(READ_AT_RUN_TIME, "1")}
    done = subprocess.run([sys.executable, "-c", recorder, site], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imports, read, by_name = json.loads(done.stdout.splitlines()[-1])
    keyed = (*READ_AT_IMPORT, *READ_WITH_TORCH, *READ_BY_PYTHON)
    assert [module for module in imports if module not in WITH_TORCH], f"no backend's module imported from {site}"
    assert read and [name for name in read if not name.startswith(keyed)] == [], "read at import, not in the key"
    assert by_name and sorted(set(READ_AT_RUN_TIME) & set(by_name)) == [], "left out of the key, read at import"


@pytest.mark.parametrize("change", ["another interpreter setting", "a module shadowed"])
def test_a_request_the_root_cannot_serve_is_spawned(root, tmp_path, change):
    env = {**os.environ, FORK_ROOT_ENV: root.socket_path}
    if change == "another interpreter setting":
        env["PYTHONHASHSEED"] = "7"
    else:  # a folder first on the path with its own numpy, which the base imported with torch
        (tmp_path / "shadow").mkdir()
        (tmp_path / "shadow" / "numpy.py").write_text("random = None\n")
        env["PYTHONPATH"] = str(tmp_path / "shadow")
    process, out, _ = start_probe(env, tmp_path)
    assert isinstance(process, subprocess.Popen), f"{change}: the root should have refused"
    process.wait(60)


def test_shadowed_names_the_module_a_fresh_interpreter_would_import_from_elsewhere(tmp_path):
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "__init__.py").write_text("")
    (tmp_path / "not_a_package").mkdir()
    import json as imported

    assert shadowed([str(tmp_path)], {"json": imported}) == (
        f"json would be imported from {tmp_path}, not {Path(imported.__file__).parents[1]}")
    assert shadowed([str(Path(imported.__file__).parents[1])], {"json": imported}) is None, "the same file"
    assert shadowed([str(tmp_path / "not_a_package")], {"json": imported}) is None


def test_a_forked_process_dies_with_the_process_that_asked_for_it(root, tmp_path):
    """The asker SIGKILLed: its connection closes and the base kills what it forked."""
    asker = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from simulators.fork_root import start_module
        child = start_module({PROBE!r}, ["0", "600"], dict(os.environ), stdin=0, stdout=2, stderr=2)
        print(type(child).__name__, child.pid, flush=True)
        os.kill(os.getpid(), 9)
        """)], env={**os.environ, FORK_ROOT_ENV: root.socket_path}, cwd=REPO, capture_output=True, text=True,
        timeout=60)
    kind, pid = asker.stdout.split()
    assert kind == "RootChild", asker.stderr
    assert still_running([int(pid)], timeout=10) == [], "the forked probe outlived its asker"


def test_killing_a_child_that_ended_before_its_exit_report_arrived_does_nothing():
    """Its base reaped it, its "exit" reply is not read yet: there is nothing left to signal (as with Popen)."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(30)  # reaped: its pid names no process now
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        child = RootChild(ours, ended.pid)
        child.kill()
        assert child.poll() is None, "no report has arrived"
        theirs.send(b"exit -9")
        assert child.wait(10) == -signal.SIGKILL


def test_closing_the_root_ends_its_bases_and_what_they_forked(tmp_path):
    root = ForkRoot()
    try:
        child, _, _ = start_probe({**os.environ, FORK_ROOT_ENV: root.socket_path}, tmp_path, 0, "600")
        assert isinstance(child, RootChild)
        base = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    finally:
        root.close()
    assert still_running([root.pid, base, child.pid], timeout=10) == []
    assert child.wait(10) == -signal.SIGKILL
    assert os.environ.get(FORK_ROOT_ENV) != root.socket_path, "a closed root is no longer named"


def test_the_output_of_a_process_that_started_a_base_ends_with_it(own_root):
    """A base forked for a request must not keep that request's streams: the reader of its stdout would never see
    the end of it (a run that finished would seem to hang)."""
    env = {**os.environ, FORK_ROOT_ENV: own_root.socket_path}  # this request forks the root's first base
    done = run_module(PROBE, "0", env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["parent"] != own_root.pid, done.stderr
