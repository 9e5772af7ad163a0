"""The names issue 13 added for parity with accelerate 1.15: each behaves as HF's does.

Catalog: env.checks, env.patch_environment, pad.pad_first_index_dim, broadcast.from_process.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import simulators
from accelerate_ref import Accelerator, AcceleratorState, GradientState
from accelerate_ref.local_sgd import LocalSGD
from accelerate_ref.utils import (
    CannotPadNestedTensorWarning,
    convert_bytes,
    convert_dict_to_env_variables,
    copy_tensor_to_devices,
    get_cpu_distributed_information,
    get_module_children_bottom_up,
    get_pretty_name,
    is_fp16_available,
    is_pytest_available,
    merge_dicts,
    pad_across_processes,
    parse_choice_from_env,
    purge_accelerate_environment,
    recursive_getattr,
    reduce,
    str_to_bool,
)


def test_simple_helpers() -> None:
    assert convert_bytes(1536) == "1.5 KB" and convert_bytes(10) == "10 bytes"
    assert merge_dicts({"a": {"b": 1}}, {"a": {"c": 2}, "d": 3}) == {"a": {"b": 1, "c": 2}, "d": 3}
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Sequential(torch.nn.ReLU()))
    assert recursive_getattr(model, "1.0") is model[1][0]
    assert get_pretty_name(model) == "Sequential" and get_pretty_name(merge_dicts) == "merge_dicts"
    names = [name for name, _ in get_module_children_bottom_up(model, return_fqns=True)]
    assert names == ["0", "1.0", "1", ""] and get_module_children_bottom_up(model)[-1] is model
    assert str_to_bool("yes", to_bool=True) is True and str_to_bool("no") == 0
    assert is_pytest_available() and is_fp16_available()


def test_env_helpers(monkeypatch) -> None:
    assert convert_dict_to_env_variables({"A": "1", "B": "x;rm", "C": "", "D": "2"}) == ["A=1\n", "D=2\n"]
    monkeypatch.setenv("CHOICE", "fp16")
    assert parse_choice_from_env("CHOICE") == "fp16" and parse_choice_from_env("UNSET_CHOICE_X", 3) == "3"
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "4")
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    info = get_cpu_distributed_information()
    assert (info.rank, info.world_size) == (2, 4)


def test_purge_accelerate_environment_restores_and_removes(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_KEPT", "before")

    @purge_accelerate_environment
    def sets_variables() -> None:
        os.environ["ACCELERATE_KEPT"] = "changed"
        os.environ["ACCELERATE_NEW"] = "1"
        raise RuntimeError("even when it raises")

    with pytest.raises(RuntimeError):
        sets_variables()
    assert os.environ["ACCELERATE_KEPT"] == "before" and "ACCELERATE_NEW" not in os.environ

    @purge_accelerate_environment
    class Base:
        def test_one(self) -> None:
            os.environ["ACCELERATE_FROM_BASE"] = "1"

    class Child(Base):
        def test_two(self) -> None:
            os.environ["ACCELERATE_FROM_CHILD"] = "1"

    Child().test_one()
    Child().test_two()
    assert "ACCELERATE_FROM_BASE" not in os.environ and "ACCELERATE_FROM_CHILD" not in os.environ


def test_nested_tensor_is_left_with_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    AcceleratorState._reset_state(True)
    Accelerator(cpu=True)
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes(nested) is nested


def _ranks_copy_and_local_sgd() -> dict:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    copied = copy_tensor_to_devices(torch.tensor([[1.5, 2.5]]) if rank == 1 else None)
    try:
        copy_tensor_to_devices(None)
        refused = ""
    except ValueError as error:
        refused = str(error)
    largest = reduce(torch.tensor([float(rank), 1.0 - rank]), "max")
    torch.manual_seed(rank)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    weights = []
    with LocalSGD(accelerator, model, local_sgd_steps=2) as sgd:
        for _ in range(2):
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(float(rank + 1))
            sgd.step()
            weights.append(model.module.weight.detach().clone().tolist())
    return {"copied": copied.tolist(), "dtype": str(copied.dtype), "refused": refused, "weights": weights,
            "max": largest.tolist()}


def test_copy_tensor_to_devices_reduce_max_and_local_sgd_on_two_ranks() -> None:
    reports = simulators.run(_ranks_copy_and_local_sgd, world=2, timeout=120)
    for report in reports:
        assert report["copied"] == [[1.5, 2.5]] and report["dtype"] == "torch.float32"
        assert "exactly one process" in report["refused"] and "0 did" in report["refused"]
        assert report["max"] == [1.0, 1.0]
    # after step 1 the ranks differ (no averaging yet); after step 2 they agree (averaged)
    assert reports[0]["weights"][0] != reports[1]["weights"][0]
    assert reports[0]["weights"][1] == reports[1]["weights"][1]
