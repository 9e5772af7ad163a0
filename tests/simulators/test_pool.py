"""The persistent rank pool: values, errors, hangs, crashes, recovery, clean shutdown."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from simulators import PoolStartError, RankPool, World
from tests.simulators import rank_functions as ranks

pytestmark = pytest.mark.slow


def target(name):
    return f"{ranks.__name__}:{name}"


def values(result):
    assert result.status == "ok", result
    return [result.outcomes[rank].value for rank in sorted(result.outcomes)]


def pids_of(pool):
    return dict(values(pool.run(target("rank_and_pid"))))


@pytest.fixture(scope="module")
def shared_pool():
    """One pool of 3 ranks for the tests that leave it running."""
    with RankPool(World.of(3)) as pool:
        yield pool


@pytest.fixture
def make_pool():
    pools = []

    def make(world, **options):
        pools.append(RankPool(World.parse(world), **options))
        return pools[-1]

    yield make
    for pool in pools:
        pool.close()


def test_one_start_many_targets(shared_pool):
    first = pids_of(shared_pool)
    for offset in range(10):
        result = shared_pool.run(target("scaled"), args=(10, offset))
        assert values(result) == [offset, 10 + offset, 20 + offset]
        assert all(o.ok and o.error is None and o.exc_types == () for o in result.outcomes.values())
        assert [o.rank for o in result.outcomes.values()] == [0, 1, 2]
    assert pids_of(shared_pool) == first


def test_a_raising_target_fails_on_its_rank_only(shared_pool):
    before = pids_of(shared_pool)
    result = shared_pool.run(target("fail_on_rank_1"))
    assert result.status == "ok"
    assert result.outcomes[0].ok and result.outcomes[0].value == "fine"
    failed = result.outcomes[1]
    assert not failed.ok and failed.value is None
    assert "ValueError: only rank 1 fails" in failed.error and "fail_on_rank_1" in failed.error
    assert failed.exc_types[0] == "builtins.ValueError"
    assert result.outcomes[2].exc_types[0] == "builtins.AssertionError"
    assert "rank 2 breaks an assertion" in result.outcomes[2].error
    assert pids_of(shared_pool) == before


@pytest.mark.parametrize("name, message", [
    (target("exits"), "SystemExit: 3"),
    (target("unpicklable"), "cannot be sent to the driver"),
    (target("no_such_function"), "AttributeError"),
    ("no_such_module_anywhere:f", "ModuleNotFoundError"),
    ("no_colon", "expected 'module:function'"),
])
def test_target_errors_do_not_end_the_workers(shared_pool, name, message):
    before = pids_of(shared_pool)
    result = shared_pool.run(name)
    assert result.status == "ok"
    assert all(not o.ok and message in o.error for o in result.outcomes.values())
    assert pids_of(shared_pool) == before


def test_output_tail_holds_what_each_rank_wrote_during_the_target(shared_pool):
    shared_pool.run(target("talk"), args=("first",))
    result = shared_pool.run(target("talk"), args=("second",))
    for rank in range(3):
        assert f"rank {rank} says second" in result.output_tail[rank]
        assert "on stderr too" in result.output_tail[rank]
        assert "first" not in result.output_tail[rank]


def test_workers_see_the_torchrun_environment_of_two_machines(make_pool):
    envs = values(make_pool("2x2").run(target("env_of_rank")))
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "0", "4", "2"), ("1", "1", "0", "4", "2"), ("2", "0", "1", "4", "2"), ("3", "1", "1", "4", "2")]
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1


def test_a_hang_names_the_stuck_ranks_with_their_stacks_then_the_pool_recovers(make_pool, assert_gone):
    pool = make_pool("3")
    before = pids_of(pool)
    port = values(pool.run(target("env_of_rank")))[0]["MASTER_PORT"]
    started = time.monotonic()
    result = pool.run(target("stuck_here_on_ranks_1_and_2"), timeout=1.0)
    assert time.monotonic() - started < 5
    assert result.status == "hang"
    assert set(result.outcomes) == {0} and result.outcomes[0].value == "rank 0 is done"
    assert sorted(result.stacks) == [1, 2]
    assert all("stuck_here_on_ranks_1_and_2" in result.stacks[rank] for rank in (1, 2))
    assert not pool.running
    assert_gone(before.values())
    assert set(pids_of(pool).values()).isdisjoint(before.values())
    assert values(pool.run(target("env_of_rank")))[0]["MASTER_PORT"] != port


def test_an_abort_is_a_crash_then_the_pool_recovers(make_pool, assert_gone):
    pool = make_pool("2")
    before = pids_of(pool)
    started = time.monotonic()
    result = pool.run(target("abort_on_rank"), args=(1,), timeout=30)
    assert time.monotonic() - started < 10
    assert result.status == "crash"
    assert result.exit_codes == {1: -signal.SIGABRT}
    assert "Fatal Python error: Aborted" in result.output_tail[1]
    assert "abort_on_rank" in result.output_tail[1]
    assert_gone(before.values())
    assert values(pool.run(target("scaled"), args=(2,))) == [0, 2]


def test_a_worker_killed_between_targets_is_replaced_before_the_next_one(make_pool, assert_gone):
    pool = make_pool("2")
    before = pids_of(pool)
    os.kill(before[1], signal.SIGKILL)
    assert_gone([before[1]])
    assert set(pids_of(pool).values()).isdisjoint(before.values())


def test_close_leaves_no_process_behind(make_pool, assert_gone):
    pool = make_pool("2")
    workers = list(pids_of(pool).values())
    grandchildren = values(pool.run(target("start_grandchild")))
    pool.close()
    assert not pool.running
    assert_gone(workers + grandchildren)
    pool.close()


def test_context_manager_starts_and_closes(assert_gone):
    with RankPool(World.of(2)) as pool:
        assert pool.running
        workers = list(pids_of(pool).values())
    assert not pool.running
    assert_gone(workers)


def test_setup_runs_once_per_worker(make_pool):
    pool = make_pool("2", setup=target("count_setup_calls"))
    for _ in range(3):
        assert values(pool.run(target("setup_calls"))) == [1, 1]


@pytest.mark.parametrize("setup, start_timeout, message", [
    ("failing_setup", 60, "RuntimeError: setup cannot find its config"),
    ("dying_setup", 60, "exited during start with exit code 3"),
    ("wait_for_ever_in_here", 3, r"ranks \[0, 1\] did not connect within 3s"),
])
def test_start_failures_raise_a_clear_error(make_pool, setup, start_timeout, message):
    pool = make_pool("2", setup=target(setup), start_timeout=start_timeout)
    started = time.monotonic()
    with pytest.raises(PoolStartError, match=message) as caught:
        pool.start()
    assert time.monotonic() - started < min(start_timeout, 20) + 3  # a failure is reported without waiting
    assert "--- rank 1 log tail ---" in str(caught.value)
    if setup == "wait_for_ever_in_here":
        assert "--- rank 0 Python stacks ---" in str(caught.value)
        assert "wait_for_ever_in_here" in str(caught.value)
    assert not pool.running


def test_a_process_group_lives_from_one_target_to_the_next(make_pool):
    pool = make_pool("2")
    assert values(pool.run(target("init_gloo"), timeout=60)) == [2, 2]
    for step in range(3):
        assert values(pool.run(target("all_reduce"), args=(step,))) == [2.0 * step] * 2
    assert values(pool.run(target("destroy_gloo"))) == [False, False]


def test_a_rank_stuck_in_a_gloo_barrier_is_a_hang_with_its_stack_and_a_new_group_follows(make_pool):
    pool = make_pool("2")
    assert values(pool.run(target("init_gloo"), timeout=60)) == [2, 2]
    result = pool.run(target("barrier_on_rank_0_only"), timeout=1.0)
    assert result.status == "hang" and list(result.stacks) == [0]
    assert "barrier_on_rank_0_only" in result.stacks[0]
    assert values(pool.run(target("gloo_all_reduce"), timeout=60)) == [3.0, 3.0]


def test_after_a_failed_reply_the_others_get_the_grace_not_the_timeout(make_pool):
    pool = make_pool("2")
    started = time.monotonic()
    result = pool.run(target("fail_on_rank_0_while_the_others_wait"), timeout=120, grace=0.5)
    assert result.status == "hang" and list(result.stacks) == [1], result
    assert "rank 0 gives up" in result.outcomes[0].error
    assert time.monotonic() - started < 60, "the waiting rank was given the whole timeout"
    ok = pool.run(target("fail_on_rank_1"), timeout=120, failed=lambda outcome: False)
    assert ok.status == "ok" and not ok.outcomes[1].ok, "a reply that is not `failed` leaves the others their time"


def test_busy_workers_die_with_a_killed_driver(tmp_path, assert_gone):
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = {sys.path!r}
        from simulators import RankPool, World
        pool = RankPool(World.of(2))
        result = pool.run("{target('rank_and_pid')}")
        print(*(o.value[1] for o in result.outcomes.values()), flush=True)
        pool.run("{target('wait_for_ever_in_here')}", timeout=600)
    """))
    process = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(tmp_path)})  # the pool's files, left by the kill
    try:
        workers = [int(pid) for pid in process.stdout.readline().split()]
    finally:
        process.kill()
        process.wait()
    assert len(workers) == 2
    assert_gone(workers)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_temporary_files_of_ranks_go_with_the_pool(make_pool, start_method):
    """Ranks are killed, not finalized: what they leave in their temporary folder (a package's
    TemporaryDirectory made at import, say) must not outlive the pool."""
    pool = make_pool("2", start_method=start_method)
    folders, files = zip(*values(pool.run(target("temporary_folder"))))
    assert all(os.path.exists(path) for path in files)
    assert len(set(folders)) == 1 and folders[0] != "/tmp", f"ranks' temporary folders: {folders}"
    pool.close()
    assert [path for path in files if os.path.exists(path)] == [], "files the ranks left in their temporary folder"


def test_pools_given_one_kept_fork_server_fork_from_it_one_after_another(assert_gone):
    """A caller's kept fork server outlives each pool it serves: the next world's workers are its children too,
    and it ends only when its owner closes it."""
    from simulators.forking import KeptZygote

    server = KeptZygote(["torch"])
    try:
        parents = []
        for world in ("2", "3"):
            with RankPool(World.parse(world), fork_server=server) as pool:
                parents.append({parent for parent, _ in values(pool.run(target("parent_pid_and_cwd")))})
        assert parents[0] == parents[1] and len(parents[0]) == 1, f"the workers' parents, per pool: {parents}"
        (zygote_pid,) = parents[0]
        os.kill(zygote_pid, 0)  # still serving after both pools closed
    finally:
        server.close()
    assert_gone([zygote_pid])


def test_a_pool_given_a_fork_server_refuses_its_own_preload():
    from simulators.forking import KeptZygote

    with pytest.raises(ValueError, match="fork_server"):
        RankPool(World.of(2), fork_server=KeptZygote([]), preload=["torch"])
