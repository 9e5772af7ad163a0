"""The mock NPU device on one rank: the stand-in ``torch_npu``, ``torch.npu`` and ``npu`` tensors.

Probes run in a rank whose import path starts with the stand-in (see
``tests/simulators/devices/worlds.py``); ``hccl`` across ranks is in ``test_devices_npu_ranks.py``.
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def npu():
    yield from device_world("npu", "1")


# -- probes (run in the rank) ------------------------------------------------------------


def loaded_with_torch():
    import importlib.metadata
    import importlib.util
    import sys

    import torch

    autoloaded = "torch_npu" in sys.modules and hasattr(torch, "npu")
    return {
        "found": importlib.util.find_spec("torch_npu") is not None,
        "metadata": importlib.metadata.version("torch_npu"),
        "autoloaded": autoloaded,
    }


def device_selection():
    import torch

    before = torch.npu.current_device()
    torch.npu.set_device(torch.device("npu", 0))
    return {
        "available": torch.npu.is_available(),
        "count": torch.npu.device_count(),
        "current": [before, torch.npu.current_device()],
        "default": str(torch.ones(1, device="npu").device),
        "method": str(torch.ones(1).npu().device),
        "memory": [torch.npu.memory_allocated(), torch.npu.mem_get_info()[0] > 0],
    }


def npu_tensors_and_mixing():
    import io

    import torch

    x = torch.arange(3.0).to("npu:0")
    try:
        x + torch.ones(3)
        mixed = None
    except RuntimeError as error:
        mixed = str(error)
    buffer = io.BytesIO()
    torch.save({"x": x}, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()))["x"]
    return {
        "type": x.device.type,
        "is_npu": x.is_npu,
        "values": (x + 1).tolist(),
        "mixed": mixed,
        "loaded": [str(loaded.device), loaded.tolist()],
        "storage": x.untyped_storage().data_ptr() == x[1:].untyped_storage().data_ptr(),
    }


def module_moves_keep_parameters():
    import torch

    model = torch.nn.Linear(3, 1)
    before = [id(p) for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to("npu:0")
    model(torch.ones(2, 3, device="npu:0")).sum().backward()
    optimizer.step()
    return {
        "same objects": [id(p) for p in model.parameters()] == before,
        "devices": sorted({p.device.type for p in model.parameters()}),
        "optimizer sees": str(optimizer.param_groups[0]["params"][0].device),
    }


def npu_rng_and_amp():
    import torch

    torch.npu.manual_seed(3)
    first = torch.randn(3, device="npu").tolist()
    state = torch.npu.get_rng_state()
    later = torch.randn(3, device="npu").tolist()
    torch.npu.set_rng_state(state)
    replay = torch.randn(3, device="npu").tolist()
    torch.manual_seed(3)
    seeded_by_torch = torch.randn(3, device="npu").tolist()
    layer = torch.nn.Linear(4, 2).npu()
    with torch.npu.amp.autocast(dtype=torch.bfloat16):
        dtype = layer(torch.ones(1, 4).npu()).dtype
    scaler = torch.npu.amp.GradScaler(init_scale=8.0)
    return {
        "replayed": later == replay,
        "torch seeds npu": first == seeded_by_torch,
        "autocast": str(dtype),
        "scaler": [scaler.get_scale(), type(scaler).__name__],
    }


def reference_on_one_npu():
    import accelerate_ref

    state = accelerate_ref.PartialState()
    return {"device": str(state.device), "type": str(state.distributed_type)}


# -- tests (run in pytest) -------------------------------------------------------------------


def test_torch_loads_the_stand_in_as_an_installed_torch_npu(npu):
    assert npu.one(loaded_with_torch) == {"found": True, "metadata": "2.13.0+sim", "autoloaded": True}


def test_torch_npu_selects_one_device_per_rank(npu):
    assert npu.one(device_selection) == {
        "available": True, "count": 1, "current": [0, 0], "default": "npu:0", "method": "npu:0", "memory": [0, True],
    }


def test_npu_tensors_report_their_device_and_refuse_cpu_partners(npu):
    got = npu.one(npu_tensors_and_mixing)
    assert got["type"] == "npu" and got["is_npu"] is True and got["values"] == [1.0, 2.0, 3.0]
    assert "Expected all tensors to be on the same device" in got["mixed"] and "npu:0 and cpu" in got["mixed"]
    assert got["loaded"] == ["npu:0", [0.0, 1.0, 2.0]]
    assert got["storage"] is True, "a view shares its base's storage"


def test_module_to_npu_keeps_the_parameters_an_optimizer_holds(npu):
    assert npu.one(module_moves_keep_parameters) == {"same objects": True, "devices": ["npu"], "optimizer sees": "npu:0"}


def test_npu_generators_and_amp(npu):
    assert npu.one(npu_rng_and_amp) == {
        "replayed": True, "torch seeds npu": True, "autocast": "torch.bfloat16", "scaler": [8.0, "GradScaler"],
    }


def test_the_reference_sees_the_npu(npu):
    assert npu.one(reference_on_one_npu) == {"device": "npu:0", "type": "DistributedType.NO"}


def loading_onto_the_npu(folder):
    import os

    import torch

    path = os.path.join(folder, "state.pt")
    torch.save({"on npu": torch.ones(2, device="npu"), "on cpu": torch.zeros(1)}, path)
    loaded = torch.load(path, map_location=torch.device("npu", 0))
    model = torch.nn.Linear(2, 1).npu()
    rebuilt = type(model.weight)(torch.zeros(1, 2), requires_grad=False)
    with torch.npu.device(0):
        inside = torch.npu.current_device()
    return {
        "loaded": {key: value.device.type for key, value in loaded.items()},
        "rebuilt": [type(rebuilt).__name__, rebuilt.device.type, rebuilt.requires_grad],
        "inside": inside,
    }


def test_loading_onto_the_npu_and_rebuilding_parameters(npu, tmp_path):
    # A map_location that is a device puts every tensor there, as torch.load documents ("the location where
    # all tensors should be loaded"); the mock kept the CPU one on the CPU before simulators.devices.families.loading.
    assert npu.one(loading_onto_the_npu, str(tmp_path)) == {
        "loaded": {"on npu": "npu", "on cpu": "npu"},
        "rebuilt": ["Parameter", "cpu", False],
        "inside": 0,
    }
