"""Issue 13's name-for-name remainder: each name behaves as HF accelerate 1.15's does.

Each test calls accelerate_ref's name and HF's side by side and compares the
results (HF accelerate is installed with the `hf` extra).
"""

from __future__ import annotations

import enum
from datetime import timedelta

import pytest
import torch

hf_constants = pytest.importorskip("accelerate.utils.constants")

import accelerate.utils as hf_utils  # noqa: E402

import accelerate_ref.utils as ref_utils  # noqa: E402
from accelerate_ref.utils import constants as ref_constants  # noqa: E402


CONSTANT_NAMES = [
    "CUDA_DISTRIBUTED_TYPES",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
]

# (module of accelerate_ref, module of HF, names the module re-exports)
REEXPORTS = [
    ("accelerate_ref.accelerator", "accelerate.accelerator",
     ["MODEL_NAME", "SCALER_NAME", "WEIGHTS_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_PATTERN_NAME",
      "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_PATTERN_NAME"]),
    ("accelerate_ref.checkpointing", "accelerate.checkpointing", ["MODEL_NAME", "SAFE_MODEL_NAME"]),
    ("accelerate_ref.utils.random", "accelerate.utils.random", ["CUDA_DISTRIBUTED_TYPES"]),
    ("accelerate_ref.utils.operations", "accelerate.utils.operations", ["TORCH_DISTRIBUTED_OPERATION_TYPES"]),
    ("accelerate_ref.utils.dataclasses", "accelerate.utils.dataclasses",
     ["XPU_PROFILING_AVAILABLE_PYTORCH_VERSION", "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION"]),
    ("accelerate_ref.utils", "accelerate.utils",
     ["TORCH_DISTRIBUTED_OPERATION_TYPES", "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
      "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION"]),
]


@pytest.mark.parametrize("name", CONSTANT_NAMES)
def test_constant_equals_hf(name: str) -> None:
    assert getattr(ref_constants, name) == getattr(hf_constants, name)


@pytest.mark.parametrize(("ref_module", "hf_module", "names"), REEXPORTS, ids=[r[0] for r in REEXPORTS])
def test_module_reexports_hf_constants(ref_module: str, hf_module: str, names: list[str]) -> None:
    import importlib

    ref, hf = importlib.import_module(ref_module), importlib.import_module(hf_module)
    assert {n: getattr(ref, n) for n in names} == {n: getattr(hf, n) for n in names}


@pytest.mark.parametrize("backend", ["nccl", "gloo", None])
@pytest.mark.parametrize("timeout", [None, timedelta(seconds=800)])
def test_init_process_group_kwargs_timeout_default_by_backend(backend, timeout) -> None:
    ref = ref_utils.InitProcessGroupKwargs(backend=backend, timeout=timeout)
    hf = hf_utils.InitProcessGroupKwargs(backend=backend, timeout=timeout)
    assert (ref.backend, ref.init_method, ref.timeout) == (hf.backend, hf.init_method, hf.timeout)


def test_enum_with_contains_tests_values() -> None:
    from accelerate.utils.dataclasses import EnumWithContains as HfMeta

    from accelerate_ref.utils.dataclasses import EnumWithContains as RefMeta

    answers = []
    for meta in (RefMeta, HfMeta):
        class Colour(enum.Enum, metaclass=meta):
            RED = "red"
            BLUE = "blue"

        answers.append(["red" in Colour, "green" in Colour, "BLUE" in Colour, "blue" in Colour])
    assert answers[0] == answers[1] == [True, False, False, True]


def test_tensor_dtype_codes_equal_hf() -> None:
    from accelerate.utils import operations as hf_ops

    from accelerate_ref.utils import operations as ref_ops

    assert ref_ops.TENSOR_TYPE_TO_INT == hf_ops.TENSOR_TYPE_TO_INT
    assert ref_ops.TENSOR_INT_TO_DTYPE == hf_ops.TENSOR_INT_TO_DTYPE


@pytest.mark.parametrize(("shape", "dtype"), [((3, 4), torch.bfloat16), ((5,), torch.int64), ((2, 1, 7), torch.bool)])
def test_gather_tensor_shape_encodes_as_hf_on_one_process(shape, dtype) -> None:
    """HF's own function reduces a `torch.empty` buffer (garbage on CPU), so it is compared by its encoding."""
    from accelerate.utils import operations as hf_ops

    from accelerate_ref import PartialState
    from accelerate_ref.utils import operations as ref_ops

    PartialState(cpu=True)
    ref_shape, ref_code = ref_ops.gather_tensor_shape(torch.ones(shape, dtype=dtype))
    assert hf_ops.TENSOR_INT_TO_DTYPE[ref_code] == dtype
    assert ref_shape.tolist() == [[d] for d in shape]


def test_verify_and_chained_operation_match_hf_on_one_process() -> None:
    from accelerate import PartialState as HfPartialState
    from accelerate.utils import operations as hf_ops

    from accelerate_ref import PartialState
    from accelerate_ref.utils import operations as ref_ops

    PartialState(cpu=True)
    HfPartialState(cpu=True)
    outcomes = []
    for ops in (ref_ops, hf_ops):
        def double(tensor):
            """Twice the tensor."""
            return tensor * 2

        def failing(tensor):
            raise ops.DistributedOperationException("inner")

        verified = ops.verify_operation(double)
        chained = ops.chained_operation(failing)
        with pytest.raises(ops.DistributedOperationException) as raised:
            chained(torch.ones(1))
        outcomes.append((
            verified(torch.arange(3)).tolist(), verified(tensor=torch.ones(2)).tolist(),
            verified.__name__, verified.__doc__, verified.__wrapped__ is double,
            str(raised.value).replace(ops.__name__, "<m>"), str(raised.value.__cause__),
        ))
    assert outcomes[0] == outcomes[1]
    assert "Error found while calling" in outcomes[0][5]


def test_gathered_parameters_is_a_no_op_without_deepspeed() -> None:
    from accelerate_ref import AcceleratorState, PartialState
    from accelerate_ref.utils import GatheredParameters, TorchDynamoPlugin

    PartialState(cpu=True)
    AcceleratorState(cpu=True, dynamo_plugin=TorchDynamoPlugin(), _from_accelerator=True)
    layer = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in layer.parameters()]
    with GatheredParameters(list(layer.parameters()), modifier_rank=0) as inside:
        assert inside is None
        assert all(p.shape == b.shape for p, b in zip(layer.parameters(), before))
    assert all(torch.equal(p, b) for p, b in zip(layer.parameters(), before))


def _both_states():
    """A fresh accelerate_ref state and a fresh HF state, one process on CPU."""
    import accelerate.state as hf_state

    import accelerate_ref.state as ref_state

    for module in (ref_state, hf_state):
        module.AcceleratorState._reset_state(True)
        module.GradientState._reset_state()
    return ref_state, hf_state


def _accelerator_state(module):
    """`AcceleratorState` as an `Accelerator` creates it (HF's refuses to be created bare)."""
    import importlib

    utils = importlib.import_module(module.__name__.replace(".state", ".utils"))
    return module.AcceleratorState(cpu=True, dynamo_plugin=utils.TorchDynamoPlugin(), _from_accelerator=True)


def test_state_module_helpers_match_hf() -> None:
    answers = []
    for module in _both_states():
        before = module.is_initialized()
        _accelerator_state(module)
        answers.append((before, module.is_initialized(), module.do_nothing(1, x=2)))
        module.AcceleratorState._reset_state(True)
    assert answers[0] == answers[1] == (False, True, None)


def test_thread_local_shared_dict_is_per_thread_and_shared_between_instances() -> None:
    import threading

    seen = []
    for module in _both_states():
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
    for module in _both_states():
        state = _accelerator_state(module)
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
    for module in _both_states():
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
    for module in _both_states():
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


@pytest.mark.parametrize("distributed_type", ["NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "XLA"])
def test_accelerator_members_match_hf(distributed_type: str) -> None:
    import accelerate

    import accelerate_ref

    answers = []
    for package, module in zip((accelerate_ref, accelerate), _both_states()):
        accelerator = package.Accelerator(cpu=True, dataloader_config=package.DataLoaderConfiguration(non_blocking=True))
        members = [accelerator.non_blocking, accelerator.use_stateful_dataloader, accelerator.should_save_model]
        for state in (module.PartialState(), accelerator.state):  # HF's AcceleratorState keeps its own copy
            state.distributed_type = getattr(module.DistributedType, distributed_type)
            state.num_processes = 1 if distributed_type == "NO" else 2
        members.append(accelerator.multi_device)
        answers.append(members)
        module.AcceleratorState._reset_state(True)
        module.GradientState._reset_state()
    assert answers[0] == answers[1]
    assert answers[0] == [True, False, True, distributed_type in ("MULTI_GPU", "MULTI_NPU")]


_SMI_ANSWERS = {
    "two RTX 4090, old driver": ("2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090\n", "535.86.10\n"),
    "two RTX 4090, fixed driver": ("2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090\n", "550.54.14\n550.54.14\n"),
    "one RTX 4090, old driver": ("1, NVIDIA GeForce RTX 4090\n", "535.86.10\n"),
    "two H100, old driver": ("2, NVIDIA H100 80GB HBM3\n2, NVIDIA H100 80GB HBM3\n", "535.86.10\n"),
}


@pytest.mark.parametrize("machine", list(_SMI_ANSWERS))
def test_nvidia_smi_helpers_match_hf(machine: str, monkeypatch) -> None:
    import subprocess

    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    names, driver = _SMI_ANSWERS[machine]

    def fake_check_output(command, universal_newlines=False):
        assert command[0] == "nvidia-smi" and universal_newlines
        return names if command[1] == "--query-gpu=count,name" else driver

    monkeypatch.setattr(subprocess, "check_output", fake_check_output)
    answers = [(env.get_gpu_info(), env.get_driver_version(), env.check_cuda_p2p_ib_support()) for env in (ref_env, hf_env)]
    assert answers[0] == answers[1]
    assert answers[0][2] is (machine != "two RTX 4090, old driver")


def test_p2p_check_says_supported_when_nvidia_smi_fails(monkeypatch) -> None:
    import subprocess

    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "check_output", missing)
    assert ref_env.check_cuda_p2p_ib_support() is hf_env.check_cuda_p2p_ib_support() is True
    with pytest.raises(FileNotFoundError):
        ref_env.get_gpu_info()


@pytest.mark.parametrize("cuda", [False, True])
def test_numa_affinity_matches_hf(cuda: bool, monkeypatch) -> None:
    """With CUDA (NVML faked: GPU 0 near CPUs 1, 3 and 65) both pin the same CPUs; without it neither pins."""
    import importlib.machinery
    import os
    import sys
    import types

    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    fake_nvml = types.ModuleType("pynvml")
    fake_nvml.__spec__ = importlib.machinery.ModuleSpec("pynvml", None)
    fake_nvml.nvmlInit = lambda: None
    fake_nvml.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    fake_nvml.nvmlDeviceGetCpuAffinity = lambda handle, words: [0b1010, 0b10][:words] + [0] * max(0, words - 2)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    monkeypatch.setattr(hf_utils, "is_rocm_available", lambda: False)
    monkeypatch.setattr(ref_utils.imports, "is_rocm_available", lambda: False)
    monkeypatch.setattr(hf_utils, "is_pynvml_available", lambda: True)
    monkeypatch.setattr(ref_utils.imports, "is_pynvml_available", lambda: True)
    pinned = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append(sorted(cpus)))
    for env in (ref_env, hf_env):
        env.override_numa_affinity(0, verbose=False)
    assert pinned == ([[1, 3, 65], [1, 3, 65]] if cuda else [])
    if cuda:  # set_numa_affinity pins once per arguments (cached), as HF's
        for env in (ref_env, hf_env):
            env.set_numa_affinity(7, verbose=False)
            env.set_numa_affinity(7, verbose=False)
        assert len(pinned) == 4


class _Wrapper(torch.nn.Module):
    """A sublayer wrapper in the HF sense: it holds the real layer as `.module`."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.module = inner


def _nested_wrapped_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Wrapper(torch.nn.Sequential(_Wrapper(_Wrapper(torch.nn.Linear(2, 2))), torch.nn.Sequential(_Wrapper(torch.nn.ReLU()))))


def _layout(module: torch.nn.Module) -> list[tuple[str, str]]:
    return [(name, type(child).__name__) for name, child in module.named_modules()]


@pytest.mark.parametrize("recursive", [False, True])
def test_extract_model_from_parallel_recursive_matches_hf(recursive: bool) -> None:
    from accelerate.utils import extract_model_from_parallel as hf_extract

    from accelerate_ref.utils import extract_model_from_parallel as ref_extract

    layouts = [_layout(extract(_nested_wrapped_model(), recursive=recursive)) for extract in (ref_extract, hf_extract)]
    assert layouts[0] == layouts[1]
    assert ("_Wrapper" in {kind for _, kind in layouts[0]}) is not recursive


def test_torch_safe_globals_let_numpy_arrays_load_as_hf(tmp_path) -> None:
    import numpy as np
    from accelerate.utils import other as hf_other

    from accelerate_ref.utils import other as ref_other

    assert ref_other.TORCH_SAFE_GLOBALS == hf_other.TORCH_SAFE_GLOBALS
    path = tmp_path / "state.pt"
    saved = {"rng": np.random.RandomState(3).get_state()[1], "weights": torch.arange(4)}
    torch.save(saved, path)
    loaded = [module.load(path) for module in (ref_other, hf_other)]
    for got in loaded:
        assert np.array_equal(got["rng"], saved["rng"]) and torch.equal(got["weights"], saved["weights"])
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(path, weights_only=True)  # what the safe globals add: plain torch refuses the array


def test_optimizer_move_to_device_matches_hf() -> None:
    from collections import OrderedDict, namedtuple

    from accelerate import optimizer as hf_optimizer

    from accelerate_ref import optimizer as ref_optimizer

    Pair = namedtuple("Pair", "a b")
    state = OrderedDict(step=torch.tensor(3.0), nested=[Pair(torch.ones(2, dtype=torch.float64), "x"), (1, None)])
    moved = [module.move_to_device(state, torch.device("meta")) for module in (ref_optimizer, hf_optimizer)]
    for got in moved:
        assert type(got) is OrderedDict and type(got["nested"][0]) is Pair and got["nested"][0].b == "x"
        assert got["step"].device.type == got["nested"][0].a.device.type == "meta"
        assert got["nested"][1] == (1, None) and got["nested"][0].a.dtype == torch.float64


def test_patch_optimizer_step_matches_hf() -> None:
    from types import SimpleNamespace

    from accelerate import optimizer as hf_optimizer

    from accelerate_ref import optimizer as ref_optimizer

    records = []
    for module in (ref_optimizer, hf_optimizer):
        holder = SimpleNamespace()
        calls = []
        step = module.patch_optimizer_step(holder, lambda *args, **kwargs: calls.append((args, kwargs)) or "stepped")
        before = hasattr(holder, "_accelerate_step_called")
        records.append((before, step(1, closure=None), holder._accelerate_step_called, calls))
    assert records[0] == records[1] == (False, "stepped", True, [((1,), {"closure": None})])


def test_top_level_synchronize_rng_states_matches_hf_on_one_process() -> None:
    import accelerate

    import accelerate_ref

    draws = []
    for package, module in zip((accelerate_ref, accelerate), _both_states()):
        _accelerator_state(module)
        torch.manual_seed(11)
        package.synchronize_rng_states(["torch"])  # one process: the generator is left as it is
        draws.append(torch.rand(3).tolist())
        module.AcceleratorState._reset_state(True)
    torch.manual_seed(11)
    assert draws[0] == draws[1] == torch.rand(3).tolist()


def test_sampler_total_length_matches_hf() -> None:
    from torch.utils.data import BatchSampler, SequentialSampler

    from accelerate import data_loader as hf_dl

    from accelerate_ref import data_loader as ref_dl

    lengths = []
    for module in (ref_dl, hf_dl):
        batches = BatchSampler(SequentialSampler(range(10)), batch_size=2, drop_last=False)
        shard = module.BatchSamplerShard(batches, num_processes=2, process_index=1)
        skip = module.SkipBatchSampler(batches, skip_batches=2)
        lengths.append((shard.total_length, len(shard), skip.total_length, len(skip)))
    assert lengths[0] == lengths[1] == (5, 3, 5, 3)


@pytest.mark.parametrize("dispatch_batches", [False, True])
def test_prepared_loader_get_and_set_sampler_match_hf(dispatch_batches: bool) -> None:
    from torch.utils.data import DataLoader, SequentialSampler

    from accelerate import data_loader as hf_dl

    from accelerate_ref import data_loader as ref_dl

    class Reversed(SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    results = []
    for module, state in zip((ref_dl, hf_dl), _both_states()):
        state.PartialState(cpu=True)
        loader = module.prepare_data_loader(DataLoader(list(range(6)), batch_size=2), dispatch_batches=dispatch_batches,
                                            put_on_device=True)
        before = type(loader.get_sampler()).__name__, type(module.get_sampler(loader)).__name__
        loader.set_sampler(Reversed(list(range(6))))
        results.append((before, type(loader.get_sampler()).__name__, [batch.tolist() for batch in loader]))
        state.AcceleratorState._reset_state(True)
        state.GradientState._reset_state()
    assert results[0] == results[1]
    assert results[0][1:] == ("Reversed", [[5, 4], [3, 2], [1, 0]])


@pytest.mark.parametrize("data_seed", [None, 5])
def test_seedable_random_sampler_orders_match_hf(data_seed) -> None:
    from accelerate import data_loader as hf_dl

    from accelerate_ref import data_loader as ref_dl

    orders = []
    for module in (ref_dl, hf_dl):
        torch.manual_seed(42)
        sampler = module.SeedableRandomSampler(range(8), data_seed=data_seed)
        orders.append([list(sampler), list(sampler), (sampler.set_epoch(0), list(sampler))[1]])
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1] and orders[0][0] == orders[0][2]
