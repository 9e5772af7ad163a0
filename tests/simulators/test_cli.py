"""``python -m simulators launch`` and ``simulators.__main__.main``."""
import textwrap

import pytest

from simulators.fork_root import run_module
from simulators.__main__ import main

pytestmark = pytest.mark.slow

SCRIPT = """
    import os, sys
    print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "on machine", os.environ["NODE_RANK"], sys.argv[1:])
    if "fail" in sys.argv:
        raise SystemExit(int(os.environ["RANK"]) + 3)
    if "hang" in sys.argv:
        import threading
        threading.Event().wait()
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def cli(*args):
    return run_module("simulators", *map(str, args), timeout=120)


def test_launch_runs_the_script_on_every_rank(script):
    done = cli("launch", "-n", "2", script, "arg")
    assert done.returncode == 0, done.stderr
    assert "[rank 0] rank 0 of 2 on machine 0 ['arg']" in done.stdout
    assert "[rank 1] rank 1 of 2 on machine 0 ['arg']" in done.stdout


def test_double_dash_and_machines(script):
    done = cli("launch", "-n", "4", "--machines", "2", "--", script, "--flag-for-the-script")
    assert done.returncode == 0, done.stderr
    assert "[rank 3] rank 3 of 4 on machine 1 ['--flag-for-the-script']" in done.stdout


def test_exit_status_is_the_failing_rank_s(script):
    done = cli("launch", "-n", "1", script, "fail")
    assert done.returncode == 3
    assert "rank 0 failed with exit code 3" in done.stderr


def test_timeout_exits_124_with_stacks(script):
    done = cli("launch", "-n", "2", "--timeout", "1.5", script, "hang")
    assert done.returncode == 124
    assert "ranks still running: 0, 1" in done.stderr
    assert "--- rank 1 Python stacks ---" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["-n", "2", "does_not_exist.py"], "script not found"),
    (["-n", "0", "x.py"], "world size must be at least 1, got size=0"),
    (["-n", "3", "--machines", "2", "x.py"], "does not divide evenly"),
])
def test_bad_command_lines_are_clear_errors(args, message):
    done = cli("launch", *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "[rank" not in done.stdout + done.stderr


def test_main_returns_the_exit_status(script, capsys):
    assert main(["launch", "-n", "1", str(script), "fail"]) == 3
    assert main(["launch", "-n", "1", str(script)]) == 0
    assert "[rank 0] rank 0 of 1" in capsys.readouterr().out
