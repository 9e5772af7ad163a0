"""The native path (issue 32), run as a GPU runner runs it: ranks started by ``torch.distributed.run`` on this host.

* It runs the implementation it names, on every rank, and says what rank 0 imported.
* It agrees with the simulator: a slice of cases per world here (worlds 1, 2 and 2x2, the last as two torchrun
  agents meeting at a c10d rendezvous), the whole suite under ``make extended``; for accelerate_ref, HF accelerate,
  and a broken implementation, which must fail natively where it is broken.
* Bad launches end in one line and exit status 2 on every rank, none left waiting.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from simulators.fork_root import run_module
from conformance.engine.native import (
    Identity,
    NativeBackend,
    NativeLaunchError,
    disagreement,
    launch_world,
    output_tail,
)
from conformance.engine.results import Status
from conformance.tools import agreement
from conformance.tools.torchrun import run_native
from simulators.topology import World

ROOT = Path(__file__).resolve().parents[2]
META = ROOT / "tests" / "conformance" / "meta"
#: Cases from several areas that run in seconds: collectives, process control (printing: output captured),
#: data loading, saving, utilities; ``kwargs.init_process_group`` rebuilds the process group under torchrun.
SLICE = ("gather.*", "reduce.*", "print.*", "process.*", "split.*", "data.shuffle_sync", "save_state.doc_example",
         "env.*", "kwargs.init_process_group")
#: Seconds before a case is a HANG in these runs (two pytest workers share two cores).
CASE_TIMEOUT = 30.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _conformance(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_module("conformance", *args, timeout=timeout, cwd=ROOT,
                      env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _torchrun(nproc: int, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    from simulators.ports import free_port

    command = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "-m", "conformance", "run", "--backend", "native", *args]
    return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1", **(env or {})})


def test_impl_reaches_the_worker_and_the_header_names_what_rank_0_imported():
    """The issue's reproduction: without ACCELERATE_IMPL, ``--impl accelerate`` tested accelerate_ref."""
    env = {key: value for key, value in os.environ.items() if key != "ACCELERATE_IMPL"}
    done = run_module("conformance", "run", "--backend", "native", "--impl", "accelerate", "-k", "enums*",
                      timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "XFAIL enums.values" in done.stdout and "UNEXPECTED PASS" not in done.stdout, done.stdout
    imported = next(line for line in done.stdout.splitlines() if line.startswith("imported: "))
    assert f"{os.sep}accelerate{os.sep}__init__.py (read by rank 0)" in imported, imported


@pytest.mark.parametrize("impl, world", [pytest.param("accelerate_ref", "1", marks=pytest.mark.extended),
                                         pytest.param("accelerate_ref", "2", marks=pytest.mark.extended),
                                         ("accelerate_ref", "2x2"), ("accelerate", "2")])
def test_native_statuses_equal_the_simulators_on_a_slice(impl, world):
    """Every case of the slice: native status == sim status at the same world, but for listed cases."""
    checked = agreement.check(impl, World.parse(world), SLICE, case_timeout=CASE_TIMEOUT)
    assert checked.compared >= 10, checked.text()
    assert checked.ok, checked.text()


def test_each_cases_output_is_captured_into_its_result_and_kept_off_the_console():
    """The issue's flood: ``load_checkpoint_in_model``'s tqdm bars (``... dev=cpu]``) went to rank 0's console."""
    native = run_native("accelerate_ref", World.parse("1"), ("bigmodel.load_checkpoint_and_dispatch",),
                        case_timeout=CASE_TIMEOUT)
    bars = [r.case for r in native.run.results if "dev=cpu" in r.output.get(0, "")]
    assert bars, [(r.case, r.output) for r in native.run.results]
    assert "dev=cpu" not in native.outputs[0], native.outputs[0]
    assert "UNEXPECTED" not in native.outputs[0] and native.returncodes == [0], native.outputs[0]


def test_a_broken_implementation_fails_natively_at_world_2_where_it_is_broken():
    """``broken_impls.gather_reversed`` (gather returns the ranks' pieces last first): its gather cases FAIL natively,
    as on the simulator, and the cases that do not rest on gather pass."""
    checked = agreement.check("broken_impls.gather_reversed", World.parse("2"), ("gather.*", "print.*"),
                              case_timeout=CASE_TIMEOUT, pythonpath=[str(META)])
    statuses = [(r.case, r.status.value) for r in checked.native]
    assert any(r.case.startswith("gather") and r.status is Status.FAIL for r in checked.native), statuses
    assert all(r.status is Status.PASS for r in checked.native if r.id.startswith("print.")), statuses
    assert checked.ok, checked.text()


@pytest.mark.extended
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
@pytest.mark.parametrize("world", ["1", "2", "2x2"])
def test_native_statuses_equal_the_simulators_on_the_whole_suite(impl, world):
    checked = agreement.check(impl, World.parse(world), case_timeout=CASE_TIMEOUT)
    print(checked.line())
    assert checked.ok, checked.text()


# Bad input: one line, exit status 2, no rank left waiting.


def test_several_ranks_without_the_launchers_rendezvous_is_one_line():
    env = {key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(WORLD_SIZE="2", RANK="0", LOCAL_WORLD_SIZE="2")
    done = run_module("conformance", "run", "--backend", "native", "-k", "enums*", timeout=60, cwd=ROOT, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().count("\n") == 0 and "MASTER_ADDR and MASTER_PORT" in done.stderr, done.stderr


def _rank_module(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    return tmp_path


def test_an_implementation_that_does_not_import_on_one_rank_stops_every_rank(tmp_path):
    folder = _rank_module(tmp_path, "half_broken", """\
        import os
        if os.environ["RANK"] == "1":
            raise ImportError("no such wheel on this rank")
        from accelerate_ref import *  # noqa
        """)
    started = time.monotonic()
    done = _torchrun(2, "--impl", "half_broken", "-k", "enums*", env={"PYTHONPATH": str(folder)})
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("conformance: ")]
    assert lines and all("rank 1: ImportError: cannot import the implementation under test 'half_broken'" in line
                         and "no such wheel on this rank" in line for line in lines), done.stderr
    assert len(lines) == 2, f"each rank says it in one line:\n{done.stderr}"
    assert time.monotonic() - started < 120, "a rank waited for the one that could not import"


def test_ranks_that_imported_different_versions_stop_every_rank(tmp_path):
    folder = _rank_module(tmp_path, "rank_versioned", """\
        import os
        from accelerate_ref import *  # noqa
        __version__ = "1.0." + os.environ["RANK"]
        """)
    done = _torchrun(2, "--impl", "rank_versioned", "-k", "enums*", env={"PYTHONPATH": str(folder)})
    lines = [line for line in done.stderr.splitlines() if line.startswith("conformance: ")]
    assert done.returncode != 0 and len(lines) == 2, done.stdout + done.stderr
    assert all("ranks disagree on what they run: rank 0 imported rank_versioned 1.0.0" in line
               and "rank 1 imported rank_versioned 1.0.1" in line for line in lines), done.stderr


# The pieces, in one process.


def test_disagreement_names_the_first_rank_that_differs_or_could_not_import():
    ref = Identity("accelerate_ref", "/a/accelerate_ref/__init__.py", "0.1.0", "abc", "host")
    assert disagreement({0: ref, 1: ref}) == ""
    other_host = Identity("accelerate_ref", "/b/accelerate_ref/__init__.py", "0.1.0", "abc", "other")
    assert disagreement({0: ref, 1: other_host}) == "", "another machine may install the same package elsewhere"
    same_host = Identity("accelerate_ref", "/b/accelerate_ref/__init__.py", "0.1.0", "abc", "host")
    assert "rank 1 imported accelerate_ref 0.1.0 (/b/accelerate_ref/__init__.py)" in disagreement({0: ref, 1: same_host})
    other_suite = Identity("accelerate_ref", "/a/accelerate_ref/__init__.py", "0.1.0", "def", "other")
    assert "with suite def" in disagreement({0: ref, 1: other_suite})
    assert disagreement({0: ref, 1: "ImportError: gone", 2: "ImportError: gone"}) == "rank 1 (and ranks [2]): ImportError: gone"


def test_captured_output_holds_what_the_block_wrote_on_both_descriptors(tmp_path):
    """In a process of its own: pytest replaces ``sys.stdout`` with its own capture, a rank does not."""
    path = tmp_path / "out.log"
    code = textwrap.dedent(f"""\
        import os, sys
        from conformance.engine.native import captured_output
        with captured_output({str(path)!r}):
            print("from python")
            os.write(2, b"from the descriptor\\n")
            sys.stderr.write("from stderr\\n")
        print("after the block")
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert output_tail(str(path)).splitlines() == ["from python", "from the descriptor", "from stderr"]
    assert done.stdout == "after the block\n" and done.stderr == ""
    assert output_tail(str(tmp_path / "missing.log")) == ""


def test_each_native_run_has_a_scratch_folder_of_its_own_removed_at_the_end(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_IMPL", "accelerate_ref")
    first, second = NativeBackend("accelerate_ref", 6.0), NativeBackend("accelerate_ref", 6.0)
    assert first.scratch != second.scratch and os.path.isdir(first.scratch) and os.path.isdir(second.scratch)
    first.close()
    assert not os.path.exists(first.scratch) and os.path.isdir(second.scratch)
    second.close()
    assert not os.path.exists(second.scratch)


def test_a_bad_world_shape_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(NativeLaunchError, match="not a whole number of machines"):
        launch_world()


def test_a_hang_ends_the_launch_with_the_reports_written_and_the_agreement_runs_the_rest_in_a_new_one():
    """``broken_impls.collective_skipped_on_one_rank``: the last rank skips gather's collective, rank 0 blocks in
    it. Rank 0 reports the case (a HANG, or the other rank's FAIL), the reports are written before the launch ends,
    and the cases after it get a launch of their own and pass."""
    results = agreement.native_results("broken_impls.collective_skipped_on_one_rank", World.parse("2"),
                                       ("gather.first_dim", "reduce.mean", "broadcast.from_process"),
                                       case_timeout=4.0, pythonpath=[str(META)])
    statuses = {r.case: r.status for r in results}
    hung = [r for r in results if r.id == "gather.first_dim"]
    assert len(hung) == 1 and hung[0].status in (Status.HANG, Status.FAIL), statuses
    assert set(statuses) - {hung[0].case} and all(
        status is Status.PASS for case, status in statuses.items() if case != hung[0].case), statuses
