"""The mock XLA device on one replica: the stand-in ``torch_xla`` package, ``xla`` tensors and their rules.

Probes run in a rank whose import path starts with the stand-in (see
``tests/simulators/devices/worlds.py``); multi-replica collectives are in
``test_devices_xla_ranks.py``.
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def xla():
    yield from device_world("xla", "1")


# -- probes (run in the rank) ------------------------------------------------------------


def found_as_installed():
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("torch_xla")
    import torch_xla
    import torch_xla.runtime as xr

    return {
        "found": spec is not None,
        "metadata": importlib.metadata.version("torch_xla"),
        "version": torch_xla.__version__,
        "device_type": xr.device_type(),
    }


def devices_and_ordinals():
    import warnings

    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = (xm.xrt_world_size(), xm.get_ordinal())
    return {
        "xm": str(xm.xla_device()),
        "device": str(torch_xla.device()),
        "explicit": str(xm.xla_device(1)),
        "supported": xm.get_xla_supported_devices(),
        "runtime": (xr.world_size(), xr.global_ordinal(), xr.local_ordinal()),
        "old names": old,
        "deprecations": sorted({w.category.__name__ for w in caught}),
        "master": (xm.is_master_ordinal(), xm.is_master_ordinal(local=False)),
        "hw": xm.xla_device_hw(xm.xla_device()),
    }


def tensors_on_the_device():
    import copy
    import io

    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    x = torch.arange(4.0).to(device)
    loaded = torch.load(io.BytesIO(_saved(x)))
    try:
        x.numpy()
        refused = None
    except TypeError as error:
        refused = str(error)
    return {
        "type": x.device.type,
        "is_xla": x.is_xla,
        "values": (x * 2 + 1).tolist(),
        "item": x.sum().item(),
        "cpu": [x.cpu().device.type, x.to("cpu").tolist()],
        "factories": [t.device.type for t in (torch.zeros(2, device=device), torch.tensor([1, 2], device=device),
                                              torch.randn(2, device="xla"), torch.empty_like(x))],
        "repr": repr(x),
        "loaded": [str(loaded.device), loaded.tolist()],
        "deepcopy": str(copy.deepcopy(x).device),
        "numpy": refused,
    }


def _saved(tensor):
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def mixing_devices():
    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    x = torch.ones(3).to(device)
    errors = {}
    for name, attempt in {
        "add": lambda: x + torch.ones(3),
        "linear": lambda: torch.nn.Linear(3, 1).to(device)(torch.ones(2, 3)),
    }.items():
        try:
            attempt()
            errors[name] = None
        except RuntimeError as error:
            errors[name] = str(error)
    scalar = (x * torch.tensor(2.0)).tolist()
    target = torch.zeros(3)
    target.copy_(x)
    return {"errors": errors, "scalar": scalar, "copied": target.tolist()}


def training_on_the_device():
    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    cpu_weights = model.weight.detach().clone()
    moved = model.to(device)
    optimizer = torch.optim.SGD(moved.parameters(), lr=0.5)
    loss = moved(torch.ones(2, 3).to(device)).pow(2).mean()
    loss.backward()
    grad = moved.weight.grad
    expected = cpu_weights - 0.5 * grad.cpu()
    xm.optimizer_step(optimizer, barrier=True)
    return {
        "grad device": str(grad.device),
        "fetched": len(xm._fetch_gradients(optimizer)),
        "stepped": torch.allclose(moved.weight.detach().cpu(), expected),
    }


def autocast_on_the_device():
    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    layer = torch.nn.Linear(4, 2).to(device)
    x = torch.ones(3, 4).to(device)
    with torch.autocast("xla", dtype=torch.bfloat16):
        y = layer(x)
        loss = torch.nn.functional.mse_loss(y, torch.zeros(3, 2, device=device))
    loss.backward()
    return {"matmul": str(y.dtype), "loss": str(loss.dtype), "grad": str(layer.weight.grad.dtype), "after": str(layer(x).dtype)}


def xla_rng():
    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    xm.set_rng_state(5)
    first = torch.randn(3, device=device).tolist()
    moved_on = xm.get_rng_state() != 5
    xm.set_rng_state(5)
    again = torch.randn(3, device=device).tolist()
    torch.manual_seed(0)
    a = torch.randn(3, device=device).tolist()
    torch.manual_seed(0)
    b = torch.randn(3, device=device).tolist()
    return {"replayed": first == again, "advanced": moved_on, "torch seed resets xla": a == b}


def recompilation_reports():
    import warnings

    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    device = xm.xla_device()
    met.clear_all()
    ran = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (4, 4, 4, 6):
            (torch.ones(rows, 2, device=device) * 3).sum()
            xm.add_step_closure(ran.append, args=(rows,))
            xm.mark_step()
        xm.mark_step()  # an empty step compiles nothing
    reports = [str(w.message) for w in caught if w.category.__name__ == "XlaRecompilationWarning"]
    counts = (met.metric_data("CompileTime")[0], met.counter_value("UncachedCompile"), met.counter_value("CachedCompile"))
    report = met.metrics_report()
    met.clear_all()
    return {"counts": counts, "reports": reports, "in report": "Recompilation" in report, "closures": ran,
            "cleared": met.counter_value("UncachedCompile")}


def host_transfers(folder):
    import collections
    import os

    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    Pair = collections.namedtuple("Pair", "a b")
    moved = xm.send_cpu_data_to_device({"x": torch.ones(2), "p": Pair(torch.zeros(1), 3), "l": [torch.ones(1)]}, device)
    lone = xm.send_cpu_data_to_device(torch.ones(2), device)
    back = xm._maybe_convert_to_cpu([torch.ones(2).to(device), "s"])
    path = os.path.join(folder, "saved.pt")
    xm.save({"w": torch.ones(2).to(device)}, path)
    saved = torch.load(path)
    return {
        "moved": [moved["x"].device.type, type(moved["p"]).__name__, moved["p"].a.device.type, moved["p"].b, moved["l"][0].device.type],
        "lone": [type(lone).__name__, lone[0].device.type],
        "back": [back[0].device.type, back[1]],
        "saved": saved["w"].device.type,
    }


def one_replica_collectives():
    import torch
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    x = torch.tensor([1.0, 2.0]).to(device)
    single = xm.all_reduce(xm.REDUCE_SUM, x, scale=3.0)
    listed = [torch.tensor([1.0]).to(device)]
    returned = xm.all_reduce(xm.REDUCE_SUM, listed, scale=3.0)
    try:
        xm.all_reduce(xm.REDUCE_SUM, [torch.ones(1)])
        refused = None
    except RuntimeError as error:
        refused = str(error)
    return {
        "single": [single.tolist(), single is x],
        "list": [returned is listed, listed[0].tolist()],
        "gather": xm.all_gather(x).tolist(),
        "rendezvous": xm.rendezvous("probe", b"me"),
        "mesh": xm.mesh_reduce("probe", {"k": 1}, lambda every: every),
        "cpu refused": refused,
    }


def loader_and_spawn():
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.xla_multiprocessing as xmp

    from simulators.devices.families import xla as mock

    loader = torch.utils.data.DataLoader(torch.arange(6.0), batch_size=2)
    device_loader = pl.MpDeviceLoader(loader, xm.xla_device())
    steps_before = mock.GRAPHS.step
    batches = [batch for batch in device_loader]
    called = []
    xmp.spawn(lambda index, word: called.append((index, word)), args=("hi",))
    torch_xla.launch(lambda word: called.append(word), args=("there",))
    try:
        xm.set_replication("xla:0", ["xla:1"])
        replication = None
    except RuntimeError as error:
        replication = str(error)
    return {
        "devices": [b.device.type for b in batches],
        "values": [b.tolist() for b in batches],
        "len": len(device_loader),
        "steps": mock.GRAPHS.step - steps_before,
        "called": called,
        "replication": replication,
    }


def reference_on_one_replica():
    import accelerate_ref

    state = accelerate_ref.PartialState()
    return {"device": str(state.device), "type": str(state.distributed_type), "processes": state.num_processes}


# -- tests (run in pytest) -------------------------------------------------------------------


def test_the_stand_in_is_found_as_an_installed_torch_xla(xla):
    found = xla.one(found_as_installed)
    assert found == {"found": True, "metadata": "2.9.0+sim", "version": "2.9.0+sim", "device_type": "CPU"}


def test_devices_and_ordinals_follow_torch_xla_2_9(xla):
    got = xla.one(devices_and_ordinals)
    assert got["xm"] == got["device"] == "xla:0" and got["explicit"] == "xla:1"
    assert got["supported"] == ["xla:0"]
    assert got["runtime"] == (1, 0, 0)
    assert got["old names"] == (1, 0) and got["deprecations"] == ["DeprecationWarning"]
    assert got["master"] == (True, True) and got["hw"] == "CPU"


def test_xla_tensors_report_their_device_and_compute_like_cpu(xla):
    got = xla.one(tensors_on_the_device)
    assert got["type"] == "xla" and got["is_xla"] is True
    assert got["values"] == [1.0, 3.0, 5.0, 7.0] and got["item"] == 6.0
    assert got["cpu"] == ["cpu", [0.0, 1.0, 2.0, 3.0]]
    assert got["factories"] == ["xla"] * 4
    assert got["repr"] == "tensor([0., 1., 2., 3.], device='xla:0')"
    assert got["loaded"] == ["xla:0", [0.0, 1.0, 2.0, 3.0]] and got["deepcopy"] == "xla:0"
    assert "Use Tensor.cpu()" in got["numpy"]


def test_mixing_xla_and_cpu_tensors_raises_like_real_hardware(xla):
    got = xla.one(mixing_devices)
    for name, error in got["errors"].items():
        assert error and "Expected all tensors to be on the same device" in error and "xla:0 and cpu" in error, name
    assert got["scalar"] == [2.0, 2.0, 2.0], "a 0-d CPU tensor is a scalar on every device"
    assert got["copied"] == [1.0, 1.0, 1.0], "copy_ moves data between devices"


def test_modules_train_on_the_device(xla):
    assert xla.one(training_on_the_device) == {"grad device": "xla:0", "fetched": 2, "stepped": True}


def test_autocast_on_xla_casts_as_torch_autocast_does(xla):
    assert xla.one(autocast_on_the_device) == {
        "matmul": "torch.bfloat16", "loss": "torch.float32", "grad": "torch.float32", "after": "torch.float32",
    }


def test_the_xla_rng_is_one_seed_of_its_own(xla):
    assert xla.one(xla_rng) == {"replayed": True, "advanced": True, "torch seed resets xla": False}


def test_a_step_with_new_shapes_is_compiled_again_and_reported(xla):
    got = xla.one(recompilation_reports)
    assert got["counts"] == (2, 2, 2), "graphs of shapes [4, 2] (once, then cached twice) and [6, 2]"
    assert len(got["reports"]) == 1 and got["in report"]
    assert "step 4" in got["reports"][0] and "[4, 2]" in got["reports"][0] and "[6, 2]" in got["reports"][0]
    assert got["closures"] == [4, 4, 4, 6] and got["cleared"] == 0


def test_host_transfers_walk_nested_data(xla, tmp_path):
    assert xla.one(host_transfers, str(tmp_path)) == {
        "moved": ["xla", "Pair", "xla", 3, "xla"],
        "lone": ["list", "xla"],
        "back": ["cpu", "s"],
        "saved": "cpu",
    }


def test_collectives_of_one_replica_return_their_input_unscaled(xla):
    got = xla.one(one_replica_collectives)
    assert got["single"] == [[1.0, 2.0], False], "a copy, unscaled, as torch-xla does with one device"
    assert got["list"] == [True, [1.0]]
    assert got["gather"] == [1.0, 2.0] and got["rendezvous"] == [b"me"] and got["mesh"] == [{"k": 1}]
    assert "expects tensors on an xla device" in got["cpu refused"]


def test_mp_device_loader_moves_batches_and_marks_steps_and_spawn_runs_in_the_rank(xla):
    got = xla.one(loader_and_spawn)
    assert got["devices"] == ["xla"] * 3 and got["values"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert got["len"] == 3 and got["steps"] == 5, "a step before each of the 4 fetches (the last finds the end) and one at the end"
    assert got["called"] == [(0, "hi"), "there"]
    assert "not among the replication devices" in got["replication"]


def test_the_reference_sees_the_xla_device(xla):
    assert xla.one(reference_on_one_replica) == {"device": "xla:0", "type": "DistributedType.NO", "processes": 1}
