"""Functions that the ranks of the simulator tests call. Holds no tests.

Kept free of pytest (and of torch at import time) so that a rank imports it
in milliseconds: the launcher and pool tests start many ranks.
"""
import os
import subprocess
import sys
import threading

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
SETUP_CALLS = []


def rank():
    return int(os.environ["RANK"])


def env_of_rank():
    return {name: os.environ[name] for name in TORCHRUN_VARS} | {"pid": os.getpid()}


def parent_pid_and_cwd():
    return os.getppid(), os.getcwd()


def rank_and_pid():
    return rank(), os.getpid()


def scaled(factor, offset=0):
    return rank() * factor + offset


def add(a, b, *, c):
    return a + b + c + rank()


def fail_on_rank_1(message="only rank 1 fails"):
    if rank() == 1:
        raise ValueError(message)
    assert rank() != 2, "rank 2 breaks an assertion"
    return "fine"


def abort_on_rank(victim):
    if rank() == victim:
        os.abort()
    threading.Event().wait()


def wait_for_ever_in_here():
    threading.Event().wait()


def stuck_here_on_ranks_1_and_2():
    if rank() != 0:
        threading.Event().wait()
    return "rank 0 is done"


def fail_on_rank_0_while_the_others_wait():
    if rank() == 0:
        raise ValueError("rank 0 gives up")
    threading.Event().wait()


def start_grandchild():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid


def talk(text):
    print(f"rank {rank()} says {text}")
    print("on stderr too", file=sys.stderr)


def exits():
    sys.exit(3)


def returns_then_dies_at_exit_on_rank(victim):
    """Return normally, but leave the interpreter's exit to end the process with code 3."""
    import atexit

    if rank() == victim:
        atexit.register(os._exit, 3)
    return rank()


def unpicklable():
    return lambda: None


def count_setup_calls():
    SETUP_CALLS.append(os.getpid())


def setup_calls():
    return len(SETUP_CALLS)


def failing_setup():
    raise RuntimeError("setup cannot find its config")


def dying_setup():
    os._exit(3)


def gloo_all_reduce():
    """A whole gloo life in one call: init from the torchrun env, all_reduce(rank + 1), destroy."""
    import torch.distributed as dist

    init_gloo()
    try:
        return all_reduce(rank() + 1.0)
    finally:
        dist.destroy_process_group()


def init_gloo():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_world_size()


def all_reduce(value):
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([float(value)])
    dist.all_reduce(tensor)
    return tensor.item()


def destroy_gloo():
    import torch.distributed as dist

    dist.destroy_process_group()
    return dist.is_initialized()


def barrier_on_rank_0_only():
    import torch.distributed as dist

    if rank() == 0:
        dist.barrier()
    return "rank 1 skipped the barrier"


def isolation_facts():
    """What a rank can tell about its own isolation: session leader, PDEATHSIG, torch already imported."""
    import ctypes
    import signal

    death_signal = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(death_signal), 0, 0, 0)  # PR_GET_PDEATHSIG
    return {
        "rank": rank(),
        "session_leader": os.getsid(0) == os.getpid(),
        "group_leader": os.getpgid(0) == os.getpid(),
        "pdeathsig": death_signal.value == signal.SIGKILL,
        "torch_preloaded": "torch" in sys.modules,
        "stack_file": os.environ["SIMULATORS_STACK_FILE"],
    }


def skip_wait_for_everyone_on_rank_1():
    """A real Accelerator whose rank 1 skips ``wait_for_everyone`` after a matched all-reduce."""
    import torch

    import accelerate_ref

    acc = accelerate_ref.Accelerator()
    acc.reduce(torch.ones(2, 3), reduction="sum")
    if acc.process_index != 1:
        acc.wait_for_everyone()
    return acc.process_index


def flight_recorder_dump_after_unjoined_broadcast():
    """Rank 0 enters a broadcast that rank 1 never joins; each rank returns its Flight Recorder dump (bytes).

    The group is left as it is (rank 0's broadcast pending): use a pool of its own.
    """
    import time

    import torch
    import torch.distributed as dist

    from simulators.watchdog import _flight_recorder_dump

    init_gloo()
    dist.all_reduce(torch.ones(3))
    if dist.get_rank() == 0:
        dist.broadcast(torch.ones(3), src=0, async_op=True)
    time.sleep(0.5)
    return _flight_recorder_dump()


def temporary_folder():
    """Where this rank's temporary files go, and a file left there on purpose."""
    import tempfile

    handle, path = tempfile.mkstemp(prefix="left-behind-")
    os.close(handle)
    return tempfile.gettempdir(), path
