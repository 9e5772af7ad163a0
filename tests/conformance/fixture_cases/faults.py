"""The fault catalog's cases (issue 14): one rank (rank 1, the FAULTY one) misbehaves in each.

Registered under ``fixture.fault.*`` so they can never be mistaken for suite
cases; :mod:`tests.simulators.faults` runs them and tabulates the verdicts.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
import torch.distributed as dist

from conformance.engine.case import case

FAULTY = 1
WORLDS = [4]


@case("fixture.fault.raises", worlds=WORLDS)
def rank_raises(impl, world):
    acc = impl.Accelerator()
    if world.rank == FAULTY:
        raise RuntimeError("rank 1 gave up")
    acc.wait_for_everyone()


@case("fixture.fault.exits_early", worlds=WORLDS)
def rank_exits_zero(impl, world):
    acc = impl.Accelerator()
    if world.rank == FAULTY:
        os._exit(0)
    acc.wait_for_everyone()


@case("fixture.fault.sigkill_mid_collective", worlds=WORLDS)
def rank_killed_in_collective(impl, world):
    """Rank 1 enters an all-reduce the others join 2 s later, and is SIGKILLed inside it."""
    acc = impl.Accelerator()
    if world.rank == FAULTY:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    else:
        time.sleep(2.0)
    acc.reduce(torch.ones(4), reduction="sum")


@case("fixture.fault.sigstop", worlds=WORLDS)
def rank_stopped(impl, world):
    acc = impl.Accelerator()
    if world.rank == FAULTY:
        os.kill(os.getpid(), signal.SIGSTOP)
    acc.wait_for_everyone()


@case("fixture.fault.skips_wait_for_everyone", worlds=WORLDS)
def rank_skips_wait_for_everyone(impl, world):
    acc = impl.Accelerator()
    acc.reduce(torch.ones(2, 3), reduction="sum")
    if world.rank != FAULTY:
        acc.wait_for_everyone()


@case("fixture.fault.different_collectives", worlds=WORLDS)
def ranks_call_different_collectives(impl, world):
    """Ranks 0 and 1 disagree: rank 0 all-reduces where rank 1 (and the rest) broadcast."""
    impl.Accelerator()
    tensor = torch.ones(3)
    if world.rank == 0:
        dist.all_reduce(tensor)
    else:
        dist.broadcast(tensor, src=0)


def _mismatched_gather(impl, world):
    acc = impl.Accelerator()
    rows = 3 if world.rank == FAULTY else 2
    return acc.gather(torch.ones(rows, 2)).shape[0]


@case("fixture.fault.mismatched_shapes_debug_mode", worlds=WORLDS, env={"ACCELERATE_DEBUG_MODE": "1"})
def mismatched_shapes_debug_mode(impl, world):
    return _mismatched_gather(impl, world)


@case("fixture.fault.mismatched_shapes", worlds=WORLDS)
def mismatched_shapes(impl, world):
    return _mismatched_gather(impl, world)


@case("fixture.fault.out_of_memory", worlds=WORLDS)
def rank_out_of_memory(impl, world):
    """Rank 1 asks for 64 TiB, far beyond this machine: the allocator refuses."""
    acc = impl.Accelerator()
    if world.rank == FAULTY:
        torch.empty(2**46, dtype=torch.uint8)
    acc.wait_for_everyone()


@case("fixture.fault.rendezvous_port_taken", worlds=WORLDS)
def rendezvous(impl, world):
    """Run with MASTER_PORT held by another socket (tests.simulators.faults arranges it)."""
    impl.Accelerator().wait_for_everyone()


@case("fixture.fault.control_channel_intruders", worlds=WORLDS)
def control_channel_intruders(impl, world):
    """Run after strangers connected to the pool's control channel (tests.simulators.faults arranges it): it must start anyway."""
    impl.Accelerator().wait_for_everyone()
