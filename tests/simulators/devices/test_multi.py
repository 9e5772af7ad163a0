"""Simulated multi-accelerator machines: several mock NPUs in one rank, each with a memory budget.

Probes run in a rank on the mock NPU (see ``tests/simulators/devices/worlds.py``) and set
the machine's environment themselves (:func:`machine`), which the mock reads
whenever it is queried: the same process sees four 64 MB NPUs in one probe
and two of another size in the next.
"""
from __future__ import annotations

import contextlib
import os

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)

MB = 10**6


@pytest.fixture(scope="module")
def npu():
    yield from device_world("npu", "1")


@pytest.fixture(scope="module")
def xla():
    yield from device_world("xla", "1")


@contextlib.contextmanager
def machine(count: str, memory: str, kind: str = "NPU"):
    """Inside the block, this process is a machine of ``count`` ``kind`` devices of ``memory`` each."""
    names = (f"SIMULATORS_{kind}_DEVICE_COUNT", "SIMULATORS_DEVICE_MEMORY")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(dict(zip(names, (count, memory))))
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- probes (run in the rank) ------------------------------------------------------------


def _layers():
    """Four 1000x1000 float32 layers (4 MB each) and the input, the same in every call."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(1000, 1000) for _ in range(4))), torch.randn(2, 1000)


def split_model_forward():
    import torch

    with machine("4", "64MB"):
        model, inputs = _layers()
        with torch.no_grad():  # a graph holding the parameters would stop Module.to from swapping them
            expected = model(inputs)
        for index, layer in enumerate(model):
            layer.to(f"npu:{index}")
        hidden = inputs
        for index, layer in enumerate(model):
            hidden = layer(hidden.to(f"npu:{index}"))
        moved = hidden
        hidden.sum().backward()
        grads = [str(layer.weight.grad.device) for layer in model]
        try:
            model[1](model[0](inputs.to("npu:0")))  # forgets to move the input of layer 1
            forgotten = None
        except RuntimeError as error:
            forgotten = str(error)
        return {
            "devices": [str(layer.weight.device) for layer in model],
            "same values": torch.equal(moved.cpu(), expected),
            "output on": str(moved.device),
            "grads on": grads,
            "forgotten move": forgotten,
            "held": [torch.npu.memory_allocated(index) > 4 * MB for index in range(4)],
        }


def out_of_memory_past_the_budget():
    import torch

    with machine("4", "64MB"):
        held = [torch.empty(4 * MB, dtype=torch.uint8, device="npu:2") for _ in range(15)]  # 60 MB
        before = torch.npu.memory_allocated(2)
        errors = []
        for attempt in (
            lambda: torch.empty(5 * MB, dtype=torch.uint8, device="npu:2"),
            lambda: torch.ones(5 * MB, dtype=torch.uint8).to("npu:2"),
            lambda: torch.cat([held[0], held[1]]),
        ):
            try:
                attempt()
                errors.append(None)
            except torch.OutOfMemoryError as error:
                errors.append(str(error))
        other_device = torch.empty(60 * MB, dtype=torch.uint8, device="npu:3")
        return {
            "errors": errors,
            "counted after refusals": torch.npu.memory_allocated(2) == before == 60 * MB,
            "another npu has its own budget": torch.npu.memory_allocated(3) == other_device.numel(),
            "held": len(held),
        }


def accounting_follows_tensor_lifetimes():
    import gc

    import torch

    with machine("4", "64MB"):
        start = [torch.npu.memory_allocated(index) for index in range(4)]
        first = torch.zeros(1_000_000, device="npu:1")  # 4 MB
        view = first[10:]
        second = torch.zeros(2_000_000, device="npu:1")  # 8 MB
        with_both = torch.npu.memory_allocated(1)
        free, total = torch.npu.mem_get_info(1)
        del first
        after_first = torch.npu.memory_allocated(1)  # the view keeps the storage
        del view, second
        gc.collect()
        emptied = torch.npu.memory_allocated(1)
        peak = torch.npu.max_memory_allocated(1)
        torch.npu.reset_peak_memory_stats(1)
        torch.npu.set_device(1)
        current = [torch.npu.memory_allocated(), torch.npu.max_memory_allocated()]
        torch.npu.set_device(0)
        return {
            "start": start,
            "with both": with_both,
            "free, total": [free, total],
            "view keeps the storage": after_first,
            "emptied": emptied,
            "peak": peak,
            "after reset (current device)": current,
            "free again": list(torch.npu.mem_get_info(1)),
        }


def moves_between_devices():
    import torch

    with machine("4", "64MB"):
        layer = torch.nn.Linear(3, 2)
        parameters = [id(p) for p in layer.parameters()]
        layer.to("npu:2")
        on_two = str(layer.weight.device)
        layer.npu(3)
        tensor = torch.arange(4.0, device="npu:3")
        return {
            "module": [on_two, str(layer.weight.device)],
            "same parameters": [id(p) for p in layer.parameters()] == parameters,
            "to npu:0": str(tensor.to("npu:0").device),
            "to device object": str(tensor.to(torch.device("npu", 1)).device),
            "values kept": tensor.to("npu:1").tolist(),
            "copy_ across": torch.zeros(4, device="npu:0").copy_(tensor).device.index,
            "cpu": str(tensor.cpu().device),
            "meta": [str(tensor.to("meta").device), torch.npu.memory_allocated(3)],
            "held on npu:2 after moving away": torch.npu.memory_allocated(2),
        }


def machine_read_when_queried():
    import torch

    seen = []
    for count, memory in (("4", "64MB"), ("2", "500MiB")):
        with machine(count, memory):
            try:
                torch.ones(1, device="npu:3")
                refused = None
            except RuntimeError as error:
                refused = str(error)
            seen.append({"count": torch.npu.device_count(), "total": torch.npu.mem_get_info(1)[1], "npu:3": refused})
    return seen


def two_xla_devices():
    import torch
    import torch_xla.core.xla_model as xm

    with machine("2", "1MB", kind="XLA"):
        second = torch.ones(1000, device="xla:1")
        errors = []
        for attempt in (
            lambda: second + torch.ones(1000, device=xm.xla_device()),
            lambda: torch.empty(300_000, device="xla:1"),
            lambda: torch.ones(1, device="xla:2"),
        ):
            try:
                attempt()
                errors.append(None)
            except RuntimeError as error:  # OutOfMemoryError is one
                errors.append(f"{type(error).__name__}: {error}")
        return {"device": str(second.device), "memory": xm.get_memory_info("xla:1"), "errors": errors}


# -- tests (run in pytest) -------------------------------------------------------------------


def test_a_model_split_by_layers_runs_across_four_npus_with_explicit_moves(npu):
    got = npu.one(split_model_forward)
    assert got["devices"] == ["npu:0", "npu:1", "npu:2", "npu:3"]
    assert got["same values"] is True and got["output on"] == "npu:3"
    assert got["grads on"] == ["npu:0", "npu:1", "npu:2", "npu:3"]
    assert got["held"] == [True] * 4


def test_a_forgotten_move_fails_with_the_device_mixing_error(npu):
    forgotten = npu.one(split_model_forward)["forgotten move"]
    assert forgotten is not None, "an npu:0 input reached an npu:1 layer without an error"
    assert "Expected all tensors to be on the same device, but found at least two devices" in forgotten
    assert "npu:1 and npu:0" in forgotten or "npu:0 and npu:1" in forgotten


def test_allocating_past_the_budget_is_out_of_memory_and_counts_nothing(npu):
    got = npu.one(out_of_memory_past_the_budget)
    assert all(error is not None for error in got["errors"]), got["errors"]
    for error in got["errors"]:
        assert error.startswith("NPU out of memory. Tried to allocate")
        assert "npu:2" in error and "61.04 MiB total capacity" in error and "57.22 MiB already allocated" in error
        assert "SIMULATORS_DEVICE_MEMORY=64MB" in error
    assert got["counted after refusals"] is True and got["another npu has its own budget"] is True


def test_allocated_peak_and_free_follow_the_live_tensors(npu):
    got = npu.one(accounting_follows_tensor_lifetimes)
    assert got["start"] == [0, 0, 0, 0]
    assert got["with both"] == 12 * MB, "a view shares its base's storage: counted once"
    assert got["free, total"] == [64 * MB - 12 * MB, 64 * MB]
    assert got["view keeps the storage"] == 12 * MB
    assert got["emptied"] == 0 and got["peak"] == 12 * MB
    assert got["after reset (current device)"] == [0, 0]
    assert got["free again"] == [64 * MB, 64 * MB]


def test_tensors_and_modules_move_between_npus(npu):
    assert npu.one(moves_between_devices) == {
        "module": ["npu:2", "npu:3"],
        "same parameters": True,
        "to npu:0": "npu:0",
        "to device object": "npu:1",
        "values kept": [0.0, 1.0, 2.0, 3.0],
        "copy_ across": 0,
        "cpu": "cpu",
        # a meta copy takes nothing; npu:3 holds the layer's 8 floats and the arange's 4 (which
        # torch makes empty, then resizes: the books follow the resize)
        "meta": ["meta", (8 + 4) * 4],
        "held on npu:2 after moving away": 0,
    }


def test_the_machine_environment_is_read_when_queried(npu):
    four, two = npu.one(machine_read_when_queried)
    assert four == {"count": 4, "total": 64 * MB, "npu:3": None}
    assert two["count"] == 2 and two["total"] == 500 * 2**20
    assert "invalid device ordinal: npu:3" in two["npu:3"] and "2 npu device(s)" in two["npu:3"]


def test_the_mock_xla_has_several_budgeted_devices_too(xla):
    got = xla.one(two_xla_devices)
    assert got["device"] == "xla:1"
    assert got["memory"] == {"bytes_used": 4000, "bytes_limit": 10**6, "peak_bytes_used": 4000}
    mixed, out_of_memory, ordinal = got["errors"]
    assert mixed.startswith("RuntimeError: Expected all tensors to be on the same device") and "xla:1 and xla:0" in mixed
    assert out_of_memory.startswith("OutOfMemoryError: XLA out of memory. Tried to allocate 1.14 MiB (xla:1;")
    assert "invalid device ordinal: xla:2" in ordinal
