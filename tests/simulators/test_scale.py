"""Issue 14: forked ranks, machine limits, collective-level hang diagnosis, one-line CLI errors."""
import pytest

from conformance.__main__ import main as conformance_main
from simulators import RankPool, World
from simulators.__main__ import main as simulators_main
from simulators.capacity import CapacityError, check_world
from simulators.flight_recorder import diagnose
from tests.simulators import rank_functions as ranks


def target(name):
    return f"{ranks.__name__}:{name}"


@pytest.mark.slow
def test_forked_ranks_keep_every_isolation_rule():
    with RankPool(World.of(3), preload=["torch"]) as pool:
        result = pool.run(target("isolation_facts"))
    assert result.status == "ok", result
    facts = [result.outcomes[rank].value for rank in range(3)]
    assert [fact["rank"] for fact in facts] == [0, 1, 2]
    assert all(fact["session_leader"] and fact["group_leader"] and fact["pdeathsig"] for fact in facts), facts
    assert all(fact["torch_preloaded"] for fact in facts), "the zygote's preload did not reach the ranks"
    assert len({fact["stack_file"] for fact in facts}) == 3, "each rank needs its own stack file"


@pytest.mark.slow
def test_spawned_ranks_do_not_preload():
    with RankPool(World.of(2), start_method="spawn") as pool:
        result = pool.run(target("isolation_facts"))
    assert not any(result.outcomes[rank].value["torch_preloaded"] for rank in range(2))
    assert all(result.outcomes[rank].value["pdeathsig"] for rank in range(2))


@pytest.mark.slow
def test_hang_names_each_ranks_collective_and_the_rank_that_never_joined():
    with RankPool(World.of(4), preload=["torch", "accelerate_ref"], env={"ACCELERATE_USE_CPU": "1"}) as pool:
        result = pool.run(target("skip_wait_for_everyone_on_rank_1"), timeout=4.0)
    assert result.status == "hang"
    text = result.collectives.text()
    assert "ranks 0, 2-3: last entered #2 gloo:barrier" in text, text
    assert "rank 1: last entered #1 gloo:all_reduce shapes [2x3] dtypes [Float]" in text, text
    assert "gloo:barrier #2 entered by ranks 0, 2-3; never joined by rank 1" in text, text
    assert sorted(result.stacks) == [0, 2, 3]


@pytest.mark.slow
def test_flight_recorder_dumps_are_read_by_torchfrtrace(tmp_path):
    """torch's own analyser reads the simulator's gloo dumps and names the rank missing from the broadcast."""
    import subprocess
    import sys

    with RankPool(World.of(2), env={"TORCH_FR_BUFFER_SIZE": "64"}) as pool:
        result = pool.run(target("flight_recorder_dump_after_unjoined_broadcast"), timeout=60.0)
    assert result.status == "ok", result
    for rank in range(2):
        (tmp_path / f"rank_{rank}").write_bytes(result.outcomes[rank].value)
    analysis = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    report = analysis.stdout + analysis.stderr  # its findings go to a logger (stderr)
    assert analysis.returncode == 0, report[-2000:]
    assert "collective: gloo:broadcast" in report and "missing ranks: {1}" in report, report


def _entry(seq, op, sizes, created=10, group=("0", "default_pg")):
    return {"record_id": seq, "collective_seq_id": seq, "profiling_name": op, "input_sizes": sizes,
            "input_dtypes": ["Float"] * len(sizes), "time_created_ns": created, "process_group": group}


def test_diagnosis_names_mismatches_and_ignores_earlier_targets():
    old = _entry(7, "gloo:broadcast", [[1]], created=1)
    records = {
        0: {"entries": [old, _entry(1, "gloo:all_reduce", [[4]])]},
        1: {"entries": [old, _entry(1, "gloo:all_reduce", [[5]])]},
        2: {"entries": [old]},
    }
    found = diagnose(records, world_size=4, since_ns=5)
    [verdict] = found.groups
    assert (verdict.call.seq, verdict.entered, verdict.never_joined, verdict.mismatched) == (1, [0, 1], [2], [1])
    assert found.last[2] is None and found.unrecorded == [3]
    assert "rank 3: no record" in found.text()


@pytest.mark.parametrize("ops, sizes, mismatched", [
    (("gloo:all_reduce", "gloo:broadcast"), ([[4]], [[4]]), [1]),
    (("gloo:all_reduce", "gloo:all_reduce"), ([[4]], [[4]]), []),
    (("gloo:barrier", "gloo:barrier"), ([[1]], [[2]]), [1]),
    (("gloo:all_to_all", "gloo:all_to_all"), ([[3]], [[5]]), []),
    (("gloo:gather", "gloo:gather"), ([[2], [2]], [[2]]), []),
], ids=["other-op", "same", "same-shapes-op", "all-to-all-uneven", "gather-root"])
def test_a_mismatch_is_another_op_or_other_shapes_where_every_rank_has_one(ops, sizes, mismatched):
    """Ranks at one sequence number mismatch when their ops differ, or when an op every rank calls with one shape
    (all-reduce, broadcast, barrier, ...) has other shapes; an all-to-all or a gather may take different ones."""
    records = {rank: {"entries": [_entry(1, op, size)]} for rank, (op, size) in enumerate(zip(ops, sizes))}
    assert diagnose(records, world_size=2).groups[0].mismatched == mismatched


def test_worlds_beyond_the_machine_name_the_limit():
    with pytest.raises(CapacityError, match="memory"):
        check_world(World.of(1000))
    check_world(World(8, 8))


@pytest.mark.parametrize("worlds", ["0", "1000", "3x0", "2x", "abc", ","])
def test_conformance_bad_worlds_are_one_line_exit_2(worlds, capsys):
    assert conformance_main(["run", "--worlds", worlds]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("conformance: error: --worlds:"), err


@pytest.mark.parametrize("argv", [["launch", "-n", "0", "x.py"], ["launch", "-n", "1000", "x.py"], ["launch", "--bogus"]])
def test_simulators_cli_errors_are_one_line_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulators_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simulators"), err


def test_json_and_html_carry_the_collective_diagnosis(tmp_path):
    from conformance.engine import report
    from conformance.engine.results import CaseResult, Status
    from conformance.engine.runner import Run

    records = {0: {"entries": [_entry(2, "gloo:barrier", [])]}, 1: {"entries": [_entry(1, "gloo:all_reduce", [[2]])]}}
    hung = CaseResult("sync.wait_for_everyone", "skips", Status.HANG, "2", "sim", "accelerate_ref", 6.0,
                      collectives=diagnose(records, world_size=2).to_json())
    run = Run({"impl": "accelerate_ref", "backend": "sim"}, [hung])
    report.write_json(run, tmp_path / "run.json")
    again = report.read_json(tmp_path / "run.json")
    assert again.results[0].collectives["groups"][0]["never_joined"] == [1]
    report.write_html([again], tmp_path / "m.html")
    assert "gloo:barrier #2 entered by rank 0; never joined by rank 1" in (tmp_path / "m.html").read_text()
