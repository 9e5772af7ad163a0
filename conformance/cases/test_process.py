"""Catalog section "Process topology and control".

Per-rank facts are returned to the driver and compared there against the
launcher's topology, so an implementation's own collectives play no part in
judging them.
"""

from __future__ import annotations

import contextlib
import io
import time

from ..case import case
from ..checks import expect_equal, expect_ranks, expect_true

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
