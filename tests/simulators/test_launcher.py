"""The launcher and the Python API, through real rank processes at worlds 1, 2, 3, 4 and 2x2."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import simulators
from simulators import RankFailure, RankTimeout, World, launch, launcher
from tests.simulators import rank_functions as ranks

pytestmark = pytest.mark.slow

WORLDS = ["1", "2", "3", "4", "2x2"]
#: Script launches run twice: ranks spawned afresh, and ranks forked from a fork server that imported torch.
SPAWNED_AND_FORKED = pytest.mark.parametrize("preload", [(), ("torch",)], ids=["spawned", "forked"])
# --- scripts the ranks run ---

def write_script(tmp_path, body, name="script.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


PIDS_PRELUDE = """
    import os, subprocess, sys, threading, time
    from pathlib import Path
    rank = int(os.environ["RANK"])
    pids = Path(sys.argv[1])
    (pids / f"rank{rank}").write_text(str(os.getpid()))
    if rank == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (pids / "grandchild").write_text(str(child.pid))
"""


def recorded_pids(directory):
    return [int(path.read_text()) for path in directory.iterdir()]


@pytest.mark.parametrize("text", WORLDS)
def test_each_rank_sees_the_torchrun_environment(text):
    world = World.parse(text)
    envs = simulators.run(ranks.env_of_rank, world=world.size, machines=world.machines, timeout=30)
    assert [env["RANK"] for env in envs] == [str(rank) for rank in range(world.size)]
    for rank, env in enumerate(envs):
        assert env["WORLD_SIZE"] == str(world.size)
        assert env["LOCAL_WORLD_SIZE"] == str(world.ranks_per_machine)
        assert env["LOCAL_RANK"] == str(rank % world.ranks_per_machine)
        assert env["NODE_RANK"] == str(rank // world.ranks_per_machine)
        assert env["MASTER_ADDR"] == "127.0.0.1"
    assert len({env["MASTER_PORT"] for env in envs}) == 1
    assert len({env["pid"] for env in envs}) == world.size


def test_every_launch_gets_a_fresh_port():
    ports = {simulators.run(ranks.env_of_rank, world=1, timeout=30)[0]["MASTER_PORT"] for _ in range(3)}
    assert len(ports) == 3


@pytest.mark.parametrize("text", WORLDS)
def test_gloo_all_reduce(text):
    world = World.parse(text)
    expected = world.size * (world.size + 1) / 2
    assert simulators.run(ranks.gloo_all_reduce, world=world.size, machines=world.machines, timeout=90) == [expected] * world.size


def test_args_and_kwargs_reach_every_rank():
    assert simulators.run(ranks.add, world=3, args=(1, 2), kwargs={"c": 10}, timeout=30) == [13, 14, 15]


@SPAWNED_AND_FORKED
def test_output_is_streamed_with_rank_prefixes(tmp_path, capsys, preload):
    script = write_script(tmp_path, """
        import os, sys
        print("out", sys.argv[1:], flush=True)
        print("err line", file=sys.stderr)
    """)
    result = launch([str(script), "a1", "a2"], World.of(2), timeout=30, preload=preload)
    out, err = capsys.readouterr()
    assert result.status == "ok" and result.exit_code == 0
    assert "[rank 0] out ['a1', 'a2']" in out and "[rank 1] out ['a1', 'a2']" in out
    assert "[rank 0] err line" in err and "[rank 1] err line" in err


@SPAWNED_AND_FORKED
def test_a_failing_rank_ends_the_run_at_once(tmp_path, capsys, assert_gone, preload):
    pids = tmp_path / "pids"
    pids.mkdir()
    script = write_script(tmp_path, PIDS_PRELUDE + """
    if rank == 1:
        while len(list(pids.iterdir())) < 4:  # every rank and the grandchild recorded
            time.sleep(0.01)
        raise ValueError("rank one exploded")
    def still_waiting_for_rank_1():
        threading.Event().wait()
    still_waiting_for_rank_1()
    """)
    started = time.monotonic()
    result = launch([str(script), str(pids)], World.of(3), timeout=60, preload=preload)
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert elapsed < 15, f"the launcher waited {elapsed:.1f}s after rank 1 failed"
    assert (result.status, result.failed_rank, result.exit_code) == ("failed", 1, 1)
    assert "rank 1 failed with exit code 1" in err
    assert "ValueError: rank one exploded" in err
    assert "ValueError: rank one exploded" in result.output_tail[1]
    assert len(recorded_pids(pids)) == 4
    assert_gone(recorded_pids(pids))


def test_a_failing_rank_ends_the_run_while_a_peer_waits_in_a_gloo_barrier(tmp_path, capsys, assert_gone):
    pids = tmp_path / "pids"
    pids.mkdir()
    script = write_script(tmp_path, PIDS_PRELUDE + """
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if rank == 1:
        raise RuntimeError("rank 1 gives up before the barrier")
    dist.barrier()
    """)
    started = time.monotonic()
    result = launch([str(script), str(pids)], World.of(2), timeout=60)
    assert time.monotonic() - started < 30
    assert (result.status, result.failed_rank) == ("failed", 1)
    assert "rank 1 gives up before the barrier" in capsys.readouterr().err
    assert_gone(recorded_pids(pids))


def test_a_rank_that_returned_and_is_still_exiting_when_a_peer_fails_has_its_exit_code(tmp_path, capsys):
    """Rank 0 returns from its script, closes its gloo pairs and takes a second more to exit; rank 1, alone in
    a barrier, fails as the pairs close, before rank 0's exit: rank 0's exit code (0) is still recorded, since
    a dry run tells the rank that finished from one stopped by the failure with it."""
    script = write_script(tmp_path, """
    import atexit, os, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if os.environ["RANK"] == "0":
        atexit.register(time.sleep, 1.0)
        atexit.register(dist.destroy_process_group)  # runs first: the pairs close, then the sleep
    else:
        dist.barrier()
    """)
    result = launch([str(script)], World.of(2), timeout=60)
    assert (result.status, result.failed_rank) == ("failed", 1), capsys.readouterr().err
    assert result.exit_codes == {0: 0, 1: 1}, f"rank 0 finished cleanly but was recorded as {result.exit_codes}"


@SPAWNED_AND_FORKED
def test_timeout_dumps_the_stack_of_every_live_rank_and_kills_them(tmp_path, capsys, assert_gone, preload):
    pids = tmp_path / "pids"
    pids.mkdir()
    script = write_script(tmp_path, PIDS_PRELUDE + """
    def stuck_in_a_collective():
        threading.Event().wait()
    stuck_in_a_collective()
    """)
    result = launch([str(script), str(pids)], World.of(2, machines=2), timeout=1.5, preload=preload)
    err = capsys.readouterr().err
    assert (result.status, result.exit_code, result.running) == ("timeout", 124, [0, 1])
    assert "ranks still running: 0, 1" in err
    for rank in (0, 1):
        assert "stuck_in_a_collective" in result.stacks[rank]
        assert f"--- rank {rank} Python stacks ---" in err
    assert err.count("stuck_in_a_collective") >= 2
    assert_gone(recorded_pids(pids))


def test_only_the_ranks_still_running_are_named_at_a_timeout(tmp_path):
    script = write_script(tmp_path, """
        import os, threading
        if os.environ["RANK"] != "0":
            threading.Event().wait()
    """)
    result = launch(str(script), World.of(3), timeout=1.5)
    assert (result.running, sorted(result.stacks)) == ([1, 2], [1, 2])
    assert result.exit_codes == {0: 0}


def test_missing_script_is_an_error_before_any_rank_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match="script not found: .*missing.py"):
        launch(str(tmp_path / "missing.py"), World.of(2), timeout=5)


def test_script_is_relative_to_cwd(tmp_path, capsys):
    write_script(tmp_path, "print('from cwd')", name="here.py")
    assert launch("here.py", World.of(1), timeout=30, cwd=tmp_path).exit_code == 0
    assert "[rank 0] from cwd" in capsys.readouterr().out


def test_env_extras_reach_the_ranks_and_override_defaults():
    extras = {"OMP_NUM_THREADS": "3", "SIMULATORS_TEST_EXTRA": "yes"}
    assert simulators.run(os.getenv, world=2, args=("OMP_NUM_THREADS",), timeout=30, env=extras) == ["3", "3"]
    assert simulators.run(os.getenv, world=2, args=("SIMULATORS_TEST_EXTRA",), timeout=30, env=extras) == ["yes", "yes"]
    assert simulators.run(os.getenv, world=1, args=("OMP_NUM_THREADS",), timeout=30) == ["1"]


def test_run_keeps_its_fork_server_for_the_next_call_in_the_same_environment(tmp_path, monkeypatch, assert_gone):
    """The ranks of calls with one environment are forked by one server, in the driver's working directory of
    their call; another environment gets another server, and the first ends then; none outlives close()."""
    def servers_and_folders(**options):
        found = simulators.run(ranks.parent_pid_and_cwd, timeout=30, **options)
        return {server for server, _ in found}, {folder for _, folder in found}

    first, _ = servers_and_folders(world=2)
    monkeypatch.chdir(tmp_path)
    second, folders = servers_and_folders(world=2)
    assert len(first) == 1 and second == first, f"two calls in one environment were forked by servers {first}, {second}"
    assert folders == {str(tmp_path)}, f"ranks started in {folders}, not in the driver's {tmp_path}"
    other, _ = servers_and_folders(world=1, env={"SIMULATORS_TEST_EXTRA": "yes"})
    assert other != first, "a call in another environment was forked by the server of the first"
    assert_gone(first)
    launcher._RUN_ZYGOTE.close()
    assert_gone(other)


def test_run_raises_rank_failure_with_the_traceback():
    with pytest.raises(RankFailure) as caught:
        simulators.run(ranks.fail_on_rank_1, world=2, args=("bad input on one rank",), timeout=30)
    assert caught.value.rank == 1 and caught.value.exit_code == 1
    assert "ValueError: bad input on one rank" in caught.value.traceback
    assert "fail_on_rank_1" in caught.value.traceback
    assert "rank 1 failed with exit code 1" in str(caught.value)


def test_run_reports_a_rank_killed_by_a_signal():
    with pytest.raises(RankFailure) as caught:
        simulators.run(ranks.abort_on_rank, world=2, args=(0,), timeout=30)
    assert (caught.value.rank, caught.value.exit_code) == (0, -signal.SIGABRT)
    assert "signal SIGABRT" in str(caught.value)
    assert "abort_on_rank" in caught.value.output_tail  # faulthandler's report of the fatal signal


def test_run_fails_when_a_rank_returns_and_then_dies():
    with pytest.raises(RankFailure) as caught:
        simulators.run(ranks.returns_then_dies_at_exit_on_rank, world=2, args=(0,), timeout=30)
    assert (caught.value.rank, caught.value.exit_code) == (0, 3)
    assert "returned from the function, then failed at interpreter exit" in caught.value.traceback


@SPAWNED_AND_FORKED
def test_launch_names_an_abort_at_interpreter_exit_after_the_script_returned(tmp_path, capsys, preload):
    """Issue 9: a rank that finished its script and then aborted while the interpreter exited is a crash,
    reported with its signal and as happening at exit."""
    script = write_script(tmp_path, """
    import atexit, os
    print("work done", flush=True)
    if os.environ["RANK"] == "1":
        atexit.register(os.abort)
    """)
    result = launch([str(script)], World.of(2), timeout=60, preload=preload)
    err = capsys.readouterr().err
    assert (result.status, result.failed_rank, result.exit_code) == ("failed", 1, 128 + signal.SIGABRT)
    assert result.failed_at_exit
    assert "rank 1 failed at interpreter exit, after its script returned, with signal SIGABRT" in err


@SPAWNED_AND_FORKED
def test_launch_does_not_call_a_crash_during_the_script_one_at_exit(tmp_path, capsys, preload):
    script = write_script(tmp_path, """
    import os
    if os.environ["RANK"] == "0":
        os.abort()
    """)
    result = launch([str(script)], World.of(2), timeout=60, preload=preload)
    assert (result.status, result.failed_rank, result.failed_at_exit) == ("failed", 0, False)
    assert "rank 0 failed with signal SIGABRT" in capsys.readouterr().err


def test_run_raises_rank_timeout_with_the_stacks():
    with pytest.raises(RankTimeout) as caught:
        simulators.run(ranks.wait_for_ever_in_here, world=2, timeout=1.5)
    assert caught.value.running == [0, 1]
    assert all("wait_for_ever_in_here" in caught.value.stacks[rank] for rank in (0, 1))
    assert "ranks still running: 0, 1" in str(caught.value)


def test_run_rejects_functions_that_cannot_travel_by_reference():
    def local_function():
        return 1

    for fn in (lambda: 1, local_function):
        with pytest.raises(ValueError, match="module level"):
            simulators.run(fn, world=1, timeout=5)


def test_run_rejects_an_empty_world():
    with pytest.raises(ValueError, match="size=0"):
        simulators.run(ranks.env_of_rank, world=0)


def test_run_from_a_script_calls_functions_of_its_main_module(tmp_path):
    script = write_script(tmp_path, """
        import os
        import simulators

        def square_rank():
            return int(os.environ["RANK"]) ** 2

        if __name__ == "__main__":
            print(simulators.run(square_rank, world=3, timeout=30))
    """)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[0, 1, 4]"


def test_forked_ranks_start_with_the_preloaded_modules_imported(tmp_path, capsys):
    """``preload``: the ranks are forked from a server that imported those modules; without it, they import
    them themselves."""
    script = write_script(tmp_path, """
        import sys
        print("torch imported at start:", "torch" in sys.modules, flush=True)
    """)
    for preload, imported in (((), False), (("torch",), True)):
        assert launch([str(script)], World.of(2), timeout=60, preload=preload).status == "ok"
        out = capsys.readouterr().out
        assert out.count(f"torch imported at start: {imported}") == 2, out


@SPAWNED_AND_FORKED
def test_each_rank_draws_its_own_numpy_random_stream(tmp_path, capsys, preload):
    """numpy seeds its global random state from the OS when numpy.random is imported; ranks forked from a server
    that imported it are seeded afresh, so that no two ranks draw the same numbers, as spawned ones do not."""
    script = write_script(tmp_path, """
        import numpy.random
        print("drew", numpy.random.randint(0, 2**31), flush=True)
    """)
    forked_with = (*preload, "numpy.random") if preload else ()
    assert launch([str(script)], World.of(2), timeout=60, preload=forked_with).status == "ok"
    drawn = [line.split()[-1] for line in capsys.readouterr().out.splitlines() if " drew " in line]
    assert len(drawn) == 2 and drawn[0] != drawn[1], f"both ranks drew {drawn}"
