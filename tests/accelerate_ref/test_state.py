"""The reference's process state and the Accelerator's process-control API.

Multi-rank tests go through the simulator at worlds 1, 2, 3, 4 and 2x2. The
ranks get the plain torchrun environment and nothing else: the reference
must see MULTI_CPU without ``cpu=True`` or ``ACCELERATE_USE_CPU``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import time
from datetime import timedelta

import pytest
import torch

import simulators
from accelerate_ref import Accelerator, AcceleratorState, PartialState
from accelerate_ref.utils import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs
from tests.side_by_side import accelerator_state_of, both_states

WORLDS = [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2)]


pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def test_single_process_without_launcher(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    state = PartialState()
    assert state.distributed_type == DistributedType.NO
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed
    assert state.device == torch.device("cpu")
    assert PartialState() .__dict__ is state.__dict__, "PartialState is a shared state"


def test_reset_state_forgets_and_names_the_cause():
    state = PartialState()
    PartialState._reset_state()
    with pytest.raises(AttributeError, match="reset"):
        state.num_processes


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_world_size_is_named(monkeypatch, value):
    monkeypatch.setenv("WORLD_SIZE", value)
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        PartialState()


def test_accelerator_attributes_single_process():
    acc = Accelerator()
    assert acc.state is AcceleratorState() or acc.state.__dict__ is AcceleratorState().__dict__
    assert acc.mixed_precision == "no"
    assert acc.sync_gradients is True
    assert acc.gradient_accumulation_steps == 1


def test_mixed_precision_and_accumulation_from_environment(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    acc = Accelerator()
    assert acc.mixed_precision == "bf16"
    assert acc.gradient_accumulation_steps == 4


def test_unknown_mixed_precision_is_refused():
    with pytest.raises(ValueError, match="fp7"):
        Accelerator(mixed_precision="fp7")


def test_accumulation_steps_and_plugin_together_are_refused():
    with pytest.raises(ValueError, match="You can only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`"):
        Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))


def test_engines_not_provided_are_named():
    """HF 1.15's refusals and words: the package for DeepSpeed, the argument for a plugin of the wrong type."""
    if importlib.util.find_spec("deepspeed") is None:
        with pytest.raises(ImportError, match="DeepSpeed is not installed"):
            Accelerator(deepspeed_plugin=object())
    with pytest.raises(TypeError, match="`fsdp_plugin` must be a FullyShardedDataParallelPlugin object"):
        Accelerator(fsdp_plugin=object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        Accelerator(no_such_argument=1)


def test_kwargs_handlers_must_be_handlers():
    with pytest.raises(AssertionError, match="must be one that inherits .*KwargsHandler"):
        Accelerator(kwargs_handlers=[{"timeout": 5}])
    with pytest.raises(ValueError, match="You can only pass one .*InitProcessGroupKwargs.* in `kwargs_handlers`"):
        Accelerator(kwargs_handlers=[InitProcessGroupKwargs(), InitProcessGroupKwargs()])


def test_decorators_return_the_function_on_a_single_process():
    """HF 1.15: one process runs every decorated function, whatever index it names."""
    state = PartialState()
    assert state.on_process(print, process_index="2") is print
    assert state.on_local_process(local_process_index=3)(print) is print


@pytest.mark.parametrize(
    "inputs, apply_padding, expected",
    [
        (["A", "B", "C"], False, ["A", "B", "C"]),
        ({"a": [1, 2], "b": [3, 4]}, False, {"a": [1, 2], "b": [3, 4]}),
    ],
)
def test_split_single_process_keeps_everything(inputs, apply_padding, expected):
    with PartialState().split_between_processes(inputs, apply_padding) as share:
        assert share == expected


def test_split_on_one_process_returns_the_input():
    """HF 1.15 returns anything as it is on a single process; a dict of unequal values is refused all the same
    (catalog split.tensor_dict)."""
    with PartialState().split_between_processes(5) as share:
        assert share == 5
    with pytest.raises(ValueError, match="All values in the dictionary must have the same length"):
        with PartialState().split_between_processes({"a": [1, 2], "b": [1]}):
            pass


# -- multi-rank: every rank reports what it saw --------------------------------


def report_topology() -> dict:
    acc = Accelerator()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        acc.print("printed")
    ran = {}
    for name, decorator in {
        "main": acc.on_main_process,
        "local_main": acc.on_local_main_process,
        "last": acc.on_last_process,
        "process_1": acc.on_process(process_index=1),
        "local_1": acc.on_local_process(local_process_index=1),
    }.items():
        ran[name] = decorator(lambda: True)() is True
    with acc.split_between_processes(list(range(7)), apply_padding=True) as padded:
        pass
    with acc.split_between_processes(torch.arange(5)) as tensor_share:
        pass
    acc.set_trigger() if acc.is_last_process else None
    triggers = [acc.check_trigger(), acc.check_trigger()]
    return {
        "env_has_cpu_flag": "ACCELERATE_USE_CPU" in os.environ,
        "type": acc.distributed_type.value,
        "device": str(acc.device),
        "backend": acc.state.backend,
        "n": acc.num_processes,
        "index": acc.process_index,
        "local": acc.local_process_index,
        "flags": (acc.is_main_process, acc.is_local_main_process, acc.is_last_process, acc.use_distributed),
        "printed": out.getvalue(),
        "ran": ran,
        "padded": padded,
        "tensor_share": tensor_share.tolist(),
        "triggers": triggers,
    }


def expected_share(items: int, size: int, rank: int) -> list[int]:
    per, extra = divmod(items, size)
    start = rank * per + min(rank, extra)
    return list(range(start, start + per + (rank < extra)))


@pytest.mark.slow
@pytest.mark.parametrize("size, machines", WORLDS, ids=[f"{m}x{s // m}" if m > 1 else str(s) for s, m in WORLDS])
def test_topology_and_process_control(size, machines):
    reports = simulators.run(report_topology, world=size, machines=machines, timeout=120)
    per_machine = size // machines
    longest = -(-7 // size)
    for rank, r in enumerate(reports):
        local = rank % per_machine
        assert not r["env_has_cpu_flag"]
        assert r["type"] == ("MULTI_CPU" if size > 1 else "NO"), r
        assert r["device"] == ("cpu:0" if size > 1 else "cpu"), "HF 1.15 indexes the CPU of a rank of several"
        assert r["backend"] == ("gloo" if size > 1 else None)
        assert (r["n"], r["index"], r["local"]) == (size, rank, local)
        assert r["flags"] == (rank == 0, local == 0, rank == size - 1, size > 1)
        assert r["printed"] == ("printed\n" if local == 0 else ""), f"rank {rank} print"
        assert r["ran"] == {  # a single process runs them all (HF 1.15)
            "main": rank == 0,
            "local_main": local == 0,
            "last": rank == size - 1,
            "process_1": rank == 1 or size == 1,
            "local_1": local == 1 or size == 1,
        }, f"rank {rank}"
        share = expected_share(7, size, rank)
        assert r["padded"] == share + [6] * (longest - len(share)), f"rank {rank} padded share"
        assert r["tensor_share"] == expected_share(5, size, rank)
        assert r["triggers"] == [True, False], f"rank {rank} triggers"


def timed_barriers() -> dict:
    acc = Accelerator()
    if acc.is_main_process:
        time.sleep(0.5)
    arrived = time.time()
    acc.wait_for_everyone()
    left = time.time()
    with acc.main_process_first():
        entered_first = time.time()
        if acc.is_main_process:
            time.sleep(0.2)
        left_first = time.time()
    with acc.local_main_process_first():
        entered_local = time.time()
        if acc.is_local_main_process:
            time.sleep(0.2)
        left_local = time.time()
    return locals() | {"acc": None}


@pytest.mark.slow
def test_synchronisation_order_two_machines():
    size, machines = 4, 2
    r = simulators.run(timed_barriers, world=size, machines=machines, timeout=120)
    assert all(x["left"] >= r[0]["arrived"] for x in r), "someone left wait_for_everyone before main arrived"
    assert all(x["entered_first"] >= r[0]["left_first"] for x in r[1:]), "main_process_first order"
    for rank in (1, 3):
        assert r[rank]["entered_local"] >= r[rank - 1]["left_local"], f"local_main_process_first order on rank {rank}"


def init_timeout_reaches_process_group() -> float:

    import torch.distributed as dist

    Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=800))])
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout.total_seconds()


@pytest.mark.slow
def test_init_process_group_kwargs_reach_the_group():
    assert simulators.run(init_timeout_reaches_process_group, world=2, timeout=120) == [800.0, 800.0]


def test_state_module_helpers_match_hf() -> None:
    answers = []
    for module in both_states():
        before = module.is_initialized()
        accelerator_state_of(module)
        answers.append((before, module.is_initialized(), module.do_nothing(1, x=2)))
        module.AcceleratorState._reset_state(True)
    assert answers[0] == answers[1] == (False, True, None)


def test_thread_local_shared_dict_is_per_thread_and_shared_between_instances() -> None:
    import threading

    seen = []
    for module in both_states():
        class Holder:
            shared = module.ThreadLocalSharedDict()

        Holder().shared["a"] = 1
        this_thread = dict(Holder.shared)
        other_thread: list = []
        worker = threading.Thread(target=lambda: other_thread.append(dict(Holder.shared)))
        worker.start()
        worker.join(timeout=10)
        replaced = Holder()
        replaced.shared = {"b": 2}
        seen.append((this_thread, other_thread, Holder().shared))
    assert seen[0] == seen[1] == ({"a": 1}, [{}], {"b": 2})


def test_accelerator_state_process_members_match_hf(capsys) -> None:
    answers = []
    for module in both_states():
        state = accelerator_state_of(module)
        state.wait_for_everyone()
        with state.split_between_processes(["A", "B", "C"], apply_padding=True) as split:
            got = list(split)
        order = []
        with state.main_process_first():
            order.append("main")
        with state.local_main_process_first():
            order.append("local")
        state.print("hello", 1)
        state.destroy_process_group()
        answers.append((got, order, state.fork_launched, capsys.readouterr().out))
        module.AcceleratorState._reset_state(True)
    assert answers[0] == answers[1] == (["A", "B", "C"], ["main", "local"], False, "hello 1\n")


def test_partial_state_set_device_matches_hf() -> None:
    devices = []
    for module in both_states():
        state = module.PartialState(cpu=True)
        kept = state.device
        state.set_device()  # already set: nothing changes
        state.device = None
        state.set_device()
        devices.append((kept, state.device))
        module.AcceleratorState._reset_state(True)
    assert devices[0] == devices[1] == (torch.device("cpu"), torch.device("cpu"))


def test_gradient_state_is_xla_gradients_synced_matches_hf(monkeypatch) -> None:
    answers = []
    for module in both_states():
        state = module.GradientState()
        first = state.is_xla_gradients_synced
        state.is_xla_gradients_synced = True
        after_set = state.is_xla_gradients_synced
        state.is_xla_gradients_synced = False
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        under_fsdp = state.is_xla_gradients_synced
        monkeypatch.delenv("ACCELERATE_USE_FSDP")
        answers.append((first, after_set, under_fsdp))
        module.GradientState._reset_state()
    assert answers[0] == answers[1] == (False, True, True)


@pytest.mark.usefixtures('fresh_accelerate_state')
@pytest.mark.parametrize("env_device, expected", [("cpu:64", torch.device("cpu", 64)), ("meta", torch.device("meta"))])
def test_accelerate_torch_device_is_the_device(monkeypatch, env_device: str, expected: torch.device) -> None:
    """``ACCELERATE_TORCH_DEVICE`` is taken as given by the state and the Accelerator (HF 1.15 does)."""
    from accelerate_ref import PartialState

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", env_device)
    assert PartialState(cpu=True).device == expected
    accelerator = Accelerator(cpu=True)
    assert accelerator.device == expected
    assert next(accelerator.prepare(torch.nn.Linear(2, 1)).parameters()).device.type == expected.type


@pytest.mark.parametrize("flag", ["1", "0", None])
def test_cpu_affinity_flag_pins_the_process_to_its_gpus_numa_node_as_hf(flag, fake_nvml_gpu, fresh_states, monkeypatch) -> None:
    """``ACCELERATE_CPU_AFFINITY=1`` (``accelerate launch --enable_cpu_affinity``) on a CUDA machine: the first
    state pins the process to the CPUs NVML names for its local GPU (pynvml and os.sched_setaffinity faked)."""
    from unittest import mock

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    if flag is None:
        monkeypatch.delenv("ACCELERATE_CPU_AFFINITY", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_CPU_AFFINITY", flag)
    pinned_by = []
    for module in both_states():
        before = len(fake_nvml_gpu)
        affinity = mock.Mock(wraps=module.set_numa_affinity)
        with mock.patch.object(module, "set_numa_affinity", affinity):  # looked up in the state module, as HF's
            module.PartialState(cpu=True)
            module.PartialState(cpu=True)
        pinned_by.append((fake_nvml_gpu[before:], affinity.call_args_list))
    assert pinned_by[0] == pinned_by[1]
    assert pinned_by[0] == (([[1, 3, 65]], [mock.call(0)]) if flag == "1" else ([], []))
