"""Catalog section "Process topology and control".

Per-rank facts are returned to the driver and compared there against the
launcher's topology, so an implementation's own collectives play no part in
judging them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulators.spawn import describe_exit

from ..engine.case import case
from ..support.checks import expect_equal, expect_ranks, expect_true
from ..support.launching import LAUNCH_VARIABLES

ATTRIBUTES = (
    "device",
    "distributed_type",
    "local_process_index",
    "mixed_precision",
    "num_processes",
    "process_index",
    "state",
    "sync_gradients",
    "use_distributed",
    "is_main_process",
    "is_local_main_process",
    "is_last_process",
)


@case("state.attributes")
def state_attributes(impl, world):
    """Every documented attribute exists and agrees with the launch topology."""
    acc = impl.Accelerator()
    missing = [name for name in ATTRIBUTES if not hasattr(acc, name)]
    expect_equal(missing, [], "attributes missing from Accelerator")
    expect_equal(acc.num_processes, world.size, "num_processes")
    expect_equal(acc.process_index, world.rank, "process_index")
    expect_equal(acc.local_process_index, world.local_rank, "local_process_index")
    expect_equal(acc.use_distributed, world.size > 1, "use_distributed")
    expect_equal(acc.is_main_process, world.rank == 0, "is_main_process")
    expect_equal(acc.is_local_main_process, world.local_rank == 0, "is_local_main_process")
    expect_equal(acc.is_last_process, world.rank == world.size - 1, "is_last_process")
    expect_equal(acc.mixed_precision, "no", "mixed_precision by default")
    expect_true(acc.sync_gradients is True, f"sync_gradients outside accumulation: expected True, got {acc.sync_gradients!r}")
    expect_equal(acc.state.num_processes, acc.num_processes, "state.num_processes")
    expect_equal(acc.state.process_index, acc.process_index, "state.process_index")
    distributed = str(acc.distributed_type).split(".")[-1]
    if world.size > 1:
        expect_true(distributed != "NO", f"distributed_type at world {world.label}: expected a multi-process type, got {distributed}")
    return {"distributed_type": distributed, "device": str(acc.device)}


@state_attributes.check
def _same_kind_everywhere(values, world):
    kinds = {(v["distributed_type"], v["device"].split(":")[0]) for v in values}
    expect_equal(len(kinds), 1, f"distributed_type/device kinds across ranks {sorted(kinds)} should be one")


@case("print.once_per_server")
def print_once_per_server(impl, world):
    """``accelerator.print`` prints once per machine, on its local main process.

    Erratum: the document also calls it "once per process"; the behaviour is once per server.
    """
    acc = impl.Accelerator()
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        acc.print("hello from print")
    return captured.getvalue()


@print_once_per_server.check
def _printed_on_local_mains(values, world):
    expect_ranks(["hello from print" in v for v in values], world.local_ranks_of(0), "accelerator.print printed")


@case("process.is_local_main")
def is_local_main(impl, world):
    """``is_local_main_process`` is true on exactly one rank per machine."""
    return impl.Accelerator().is_local_main_process


@is_local_main.check
def _one_per_machine(values, world):
    expect_ranks(values, world.local_ranks_of(0), "is_local_main_process")


@case("process.is_main")
def is_main(impl, world):
    """``is_main_process`` is true on exactly one rank overall."""
    return impl.Accelerator().is_main_process


@is_main.check
def _one_overall(values, world):
    expect_ranks(values, [rank == 0 for rank in range(world.size)], "is_main_process")


def _ran(decorate) -> bool:
    """Whether a function decorated by ``decorate`` runs on this rank."""
    calls = []

    @decorate
    def record():
        calls.append(True)

    record()
    return bool(calls)


@case("process.on_local_main_process")
def on_local_main_process(impl, world):
    """The decorated function runs on local rank 0 of each machine only."""
    return _ran(impl.Accelerator().on_local_main_process)


@on_local_main_process.check
def _ran_on_local_mains(values, world):
    expect_ranks(values, world.local_ranks_of(0), "@on_local_main_process function ran")


@case("process.on_main_process")
def on_main_process(impl, world):
    """The decorated function runs on rank 0 only.

    Erratum: the example's docstring says "once per server"; the behaviour is once overall.
    """
    return _ran(impl.Accelerator().on_main_process)


@on_main_process.check
def _ran_on_main(values, world):
    expect_ranks(values, [rank == 0 for rank in range(world.size)], "@on_main_process function ran")


def _doc_index(count: int) -> int:
    """The documents use index 2; smaller worlds use their highest index."""
    return min(2, count - 1)


@case("process.on_local_process")
def on_local_process(impl, world):
    """``on_local_process(local_process_index=2)`` runs on local rank 2 of each machine.

    Erratum: the overview spells the keyword ``local_process_idx``; the
    signature is ``local_process_index``, which this case uses.
    """
    acc = impl.Accelerator()
    return _ran(acc.on_local_process(local_process_index=_doc_index(world.ranks_per_machine)))


@on_local_process.check
def _ran_on_local_index(values, world):
    target = _doc_index(world.ranks_per_machine)
    expect_ranks(values, world.local_ranks_of(target), f"@on_local_process(local_process_index={target}) function ran")


@case("process.on_process")
def on_process(impl, world):
    """``on_process(process_index=2)`` runs on rank 2 only ("Printed on process 2")."""
    return _ran(impl.Accelerator().on_process(process_index=_doc_index(world.size)))


@on_process.check
def _ran_on_index(values, world):
    target = _doc_index(world.size)
    expect_ranks(values, [rank == target for rank in range(world.size)], f"@on_process(process_index={target}) function ran")


@case("process.on_last_process")
def on_last_process(impl, world):
    """The decorated function runs on the last rank only."""
    return _ran(impl.Accelerator().on_last_process)


@on_last_process.check
def _ran_on_last(values, world):
    expect_ranks(values, [rank == world.size - 1 for rank in range(world.size)], "@on_last_process function ran")


MAIN_DELAY_S = 1.0


@case("sync.wait_for_everyone")
def wait_for_everyone(impl, world):
    """No rank leaves ``wait_for_everyone()`` before the main process arrives there.

    The main process sleeps first (the document sleeps 2 s; 1 s is enough to
    see the order); alone, the call returns at once.
    """
    acc = impl.Accelerator()
    if acc.is_main_process:
        time.sleep(MAIN_DELAY_S if world.size > 1 else 0)
    arrived = time.time()
    acc.wait_for_everyone()
    return {"arrived": arrived, "left": time.time()}


@wait_for_everyone.check
def _nobody_leaves_before_main_arrives(values, world):
    main_arrived = values[0]["arrived"]
    early = [rank for rank, v in enumerate(values) if v["left"] < main_arrived]
    expect_equal(early, [], "ranks that left wait_for_everyone() before the main process arrived")
    if world.size == 1:
        expect_true(values[0]["left"] - main_arrived < 0.5, "wait_for_everyone() alone should return at once")


def _goes_first(block, is_first: bool) -> dict[str, float]:
    with block():
        entered = time.time()
        if is_first:
            time.sleep(0.3)
        left = time.time()
    return {"entered": entered, "left": left}


@case("sync.main_process_first")
def main_process_first(impl, world):
    """Rank 0 runs the block and leaves it before any other rank enters it."""
    acc = impl.Accelerator()
    return _goes_first(acc.main_process_first, acc.is_main_process)


@main_process_first.check
def _main_leaves_first(values, world):
    early = [rank for rank, v in enumerate(values[1:], start=1) if v["entered"] < values[0]["left"]]
    expect_equal(early, [], "ranks that entered main_process_first() before the main process left it")


@case("sync.local_main_process_first")
def local_main_process_first(impl, world):
    """Per machine, local rank 0 runs the block and leaves before the machine's other ranks enter."""
    acc = impl.Accelerator()
    return _goes_first(acc.local_main_process_first, acc.is_local_main_process)


@local_main_process_first.check
def _local_main_leaves_first(values, world):
    per = world.ranks_per_machine
    early = [
        rank
        for rank, v in enumerate(values)
        if rank % per != 0 and v["entered"] < values[rank - rank % per]["left"]
    ]
    expect_equal(early, [], "ranks that entered local_main_process_first() before their machine's local main left it")


@case("trigger.set_check")
def set_check_trigger(impl, world):
    """``set_trigger()`` on one rank makes ``check_trigger()`` True on every rank, then False again.

    Erratum: the example calls ``accelerator.check_breakpoint()``; the method is ``check_trigger()``.
    """
    acc = impl.Accelerator()
    before = acc.check_trigger()
    if world.rank == world.size - 1:
        acc.set_trigger()
    raised = acc.check_trigger()
    after = acc.check_trigger()
    return [before, raised, after]


@set_check_trigger.check
def _trigger_seen_everywhere_once(values, world):
    for rank, seen in enumerate(values):
        expect_equal(seen, [False, True, False], f"rank {rank}: check_trigger() before set, after set, after reset")


_CLEAN_EXIT_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "clean_exit.py"
_CLEAN_EXIT_LAUNCH_TIMEOUT = 100.0


@case("state.clean_exit", worlds=(2, 4), timeout=_CLEAN_EXIT_LAUNCH_TIMEOUT + 20)
def state_clean_exit(impl, world):
    """A script that uses the Accelerator and returns normally exits 0 on every rank under torchrun.

    Rank 0 of the world starts ``conformance/scripts/clean_exit.py`` with
    ``torch.distributed.run --standalone --nproc_per_node <world size>`` and
    the implementation under test; the other ranks wait. It fails when a rank
    exits non-zero (an abort at interpreter exit is named as such), when a
    rank did not get to the end of its script, and when the default process
    group is still up once every ``atexit`` callback has run: then gloo's
    worker threads live into finalization, where they abort a rank whenever
    the machine is loaded enough (see the script's docstring).
    """
    if world.rank != 0:
        return None
    with tempfile.TemporaryDirectory(prefix="conformance-clean-exit-") as reports:
        launch = _launch_clean_exit(impl.name, world.size, reports)
        facts = {
            rank: json.loads(Path(reports, f"rank{rank}.json").read_text(encoding="utf-8"))
            for rank in range(world.size)
            if Path(reports, f"rank{rank}.json").exists()
        }
    exit_codes = _torchrun_exit_codes(launch.stdout + launch.stderr)
    failed = {rank: code for rank, code in exit_codes.items() if code != 0}
    at_exit = [f"rank {rank} ({describe_exit(code)}, after its script returned)"
               for rank, code in sorted(failed.items()) if facts.get(rank, {}).get("returned")]
    expect_equal(at_exit, [], "ranks that finished their script and then failed at interpreter exit")
    expect_true(launch.returncode == 0,
                f"torchrun exited {launch.returncode} (ranks failed: {failed or 'see output'}):\n{launch.stderr[-2000:]}")
    unfinished = [rank for rank in range(world.size) if not facts.get(rank, {}).get("returned")]
    expect_equal(unfinished, [], "ranks that did not reach the end of the script")
    gathered = {rank: facts[rank]["gathered"] for rank in range(world.size)}
    expect_equal(gathered, {rank: list(range(world.size)) for rank in range(world.size)}, "gather() in the script, per rank")
    left_up = [rank for rank in range(world.size) if facts[rank].get("group_up_at_exit")]
    expect_equal(left_up, [], "ranks whose default process group was still up when the interpreter began to "
                 "finalize (after every atexit callback); gloo's worker threads can then abort the rank at exit")
    return None


def _launch_clean_exit(impl_name: str, size: int, reports: str) -> subprocess.CompletedProcess:
    """Run the clean-exit script on ``size`` ranks under torchrun; SIGTERM torchrun (which ends its ranks) past the timeout.

    The ranks keep this rank's environment (``ACCELERATE_USE_CPU`` included, unlike the launcher cases'
    `clean_env`) except its launch variables: torchrun gives them their own."""
    env = {key: value for key, value in os.environ.items()
           if key not in LAUNCH_VARIABLES and not key.startswith("TORCHELASTIC_")}
    env.update(
        CONFORMANCE_EXIT_IMPL=impl_name,
        CONFORMANCE_EXIT_REPORT=reports,
        PYTHONPATH=os.pathsep.join(dict.fromkeys(entry or os.getcwd() for entry in sys.path)),
        OMP_NUM_THREADS="1",
    )
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(size),
            str(_CLEAN_EXIT_SCRIPT)]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as torchrun:
        try:
            stdout, stderr = torchrun.communicate(timeout=_CLEAN_EXIT_LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            torchrun.send_signal(signal.SIGTERM)
            stdout, stderr = torchrun.communicate(timeout=30)
            raise AssertionError(f"torchrun did not finish the clean-exit script in {_CLEAN_EXIT_LAUNCH_TIMEOUT:.0f}s:\n"
                                 f"{stderr[-2000:]}") from None
    return subprocess.CompletedProcess(argv, torchrun.returncode, stdout, stderr)


def _torchrun_exit_codes(output: str) -> dict[int, int]:
    """Global rank -> exit code of each failed rank, from torchrun's failure summary."""
    return {int(rank): int(code)
            for rank, code in re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", output)}
