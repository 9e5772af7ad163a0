"""Catalog section "Device families": the implementation on XLA (TPU) and NPU (Ascend) devices.

These cases declare their device family, so the simulated backends run them
on that family's mock only (``sim-xla``, ``sim-npu``); on ``native`` they
report NOT_SUPPORTED where the family's package is missing. Every other
case of the suite runs on the mock devices too: that is what
``xla.collectives`` and ``npu.collectives`` promise in general, and these
cases check it on tensors that must stay on the device.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import Any

import torch

from ..engine.case import ANY_WORLD, NotSupported, case
from ..support.checks import expect_equal, expect_tensor, expect_true

DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")
#: The distributed type's name an implementation may report on each family
#: (``TPU`` is the documented v0.27 name of ``XLA``).
DISTRIBUTED_TYPES = {"xla": ("XLA", "TPU"), "npu": ("MULTI_NPU",)}
PACKAGES = {"xla": "torch_xla", "npu": "torch_npu"}


def _require(device_type: str) -> None:
    if importlib.util.find_spec(PACKAGES[device_type]) is None:
        raise NotSupported(f"no {device_type} device here: {PACKAGES[device_type]} is not installed")


def _distributed_type(impl: Any, world: Any, device_type: str) -> dict:
    """The implementation reports the family's distributed type, and devices of the family, one per local rank."""
    _require(device_type)
    acc = impl.Accelerator()
    distributed = str(acc.distributed_type).split(".")[-1]
    expect_true(
        distributed in DISTRIBUTED_TYPES[device_type],
        f"distributed_type on the {device_type} device: expected one of {DISTRIBUTED_TYPES[device_type]}, got {distributed}",
    )
    expect_equal(acc.num_processes, world.size, "num_processes")
    expect_equal(acc.process_index, world.rank, "process_index")
    expect_equal(acc.device.type, device_type, "accelerator.device.type")
    placed = torch.arange(3).to(acc.device)
    expect_equal(placed.device.type, device_type, "a tensor moved to accelerator.device: its device type")
    return {"device": str(acc.device), "machine": world.machine}


def _one_device_per_local_rank(values: list, world: Any) -> None:
    for machine in range(world.machines):
        devices = [v["device"] for v in values if v["machine"] == machine]
        expect_equal(len(set(devices)), len(devices), f"devices of the ranks of machine {machine} should differ: {devices}")


@case("xla.distributed_type", worlds=DISTRIBUTED_WORLDS, device="xla")
def xla_distributed_type(impl, world):
    """Under the mock XLA device: XLA (or its documented alias TPU) and an ``xla`` device per replica."""
    return _distributed_type(impl, world, "xla")


@case("npu.distributed_type", worlds=DISTRIBUTED_WORLDS, device="npu")
def npu_distributed_type(impl, world):
    """Under the mock NPU device: MULTI_NPU and an ``npu`` device per rank."""
    return _distributed_type(impl, world, "npu")


xla_distributed_type.check(_one_device_per_local_rank)
npu_distributed_type.check(_one_device_per_local_rank)


def _on(device_type: str, value: Any, what: str) -> None:
    expect_true(isinstance(value, torch.Tensor), f"{what}: expected a tensor, got {type(value).__name__}")
    expect_equal(value.device.type, device_type, f"{what}: the result's device type")


def _collectives(impl: Any, world: Any, device_type: str) -> None:
    """gather, reduce (sum, mean), broadcast and pad give the documented values, on the device."""
    _require(device_type)
    acc = impl.Accelerator()
    r, n = world.rank, world.size
    mine = torch.tensor([10.0 * r, 10.0 * r + 1]).to(acc.device)
    gathered = acc.gather(mine)
    _on(device_type, gathered, "gather")
    expect_tensor(gathered.cpu(), [v for q in range(n) for v in (10.0 * q, 10.0 * q + 1)], "gather of [10r, 10r + 1]")
    summed = acc.reduce(mine, reduction="sum")
    _on(device_type, summed, "reduce(sum)")
    total = sum(10.0 * q for q in range(n))
    expect_tensor(summed.cpu(), [total, total + n], "reduce(sum) of [10r, 10r + 1]")
    averaged = impl.utils.reduce(mine, reduction="mean")
    _on(device_type, averaged, "reduce(mean)")
    expect_tensor(averaged.cpu(), [total / n, total / n + 1], "reduce(mean) of [10r, 10r + 1]")
    shared = impl.utils.broadcast(torch.tensor([r, 7 * r]).to(acc.device), from_process=n - 1)
    _on(device_type, shared, "broadcast")
    expect_tensor(shared.cpu(), [n - 1, 7 * (n - 1)], f"broadcast from process {n - 1}")
    padded = acc.pad_across_processes(torch.arange(r + 1).to(acc.device))
    _on(device_type, padded, "pad_across_processes")
    expect_tensor(padded.cpu(), list(range(r + 1)) + [0] * (n - 1 - r), "pad_across_processes of arange(r + 1)")
    objects = impl.utils.broadcast_object_list([f"from {r}", {"rank": r}], from_process=0)
    expect_equal(objects, ["from 0", {"rank": 0}], "broadcast_object_list from process 0")


@case("xla.collectives", worlds=DISTRIBUTED_WORLDS, device="xla")
def xla_collectives(impl, world):
    """The collectives give the same results on the mock XLA device, and their results stay on it."""
    _collectives(impl, world, "xla")


@case("npu.collectives", worlds=DISTRIBUTED_WORLDS, device="npu")
def npu_collectives(impl, world):
    """The collectives give the same results on the mock NPU device, and their results stay on it."""
    _collectives(impl, world, "npu")


@case("xla.reduce_scale", device="xla")
def xla_reduce_scale(impl, world):
    """``reduce(t, reduction, scale=s)`` multiplies the reduced value by ``s`` on XLA, at every world."""
    _require("xla")
    acc = impl.Accelerator()
    n = world.size
    mine = torch.tensor([1.0 + world.rank, 2.0]).to(acc.device)
    total = sum(1.0 + q for q in range(n))
    scaled = impl.utils.reduce(mine, reduction="sum", scale=2.0)
    _on("xla", scaled, "reduce(sum, scale=2.0)")
    expect_tensor(scaled.cpu(), [2.0 * total, 4.0 * n], f"reduce(sum, scale=2.0) of [1 + r, 2] at {n} processes")
    averaged = acc.reduce(mine, reduction="mean", scale=0.5)
    expect_tensor(averaged.cpu(), [0.5 * total / n, 1.0], f"accelerator.reduce(mean, scale=0.5) of [1 + r, 2] at {n} processes")


# -- xla.static_shapes ---------------------------------------------------------------

STEPS = 6
FEATURES = 4


def _compiles(metrics: Any) -> int:
    """Graphs compiled so far (torch-xla's CompileTime metric counts them)."""
    data = metrics.metric_data("CompileTime")
    return data[0] if data else 0


def _training_steps(acc: Any, model: Any, optimizer: Any, xm: Any, batch: int) -> None:
    """One training step per call, on ``batch`` rows, ended with ``xm.mark_step()`` as torch-xla scripts do."""
    x = torch.arange(batch * FEATURES, dtype=torch.float32).reshape(batch, FEATURES).to(acc.device) / 10
    loss = model(x).pow(2).mean()
    acc.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    xm.mark_step()


@case("xla.static_shapes", worlds=[1, 2], device="xla")
def xla_static_shapes(impl, world):
    """Steps with static shapes reuse one compiled graph; a step whose shapes change is compiled again.

    The quicktour's TPU notes: dynamic padding and shape-changing loops make
    training slow, because every new shape compiles a new graph. Counted with
    torch-xla's ``CompileTime`` metric; the simulator also names the step and
    the shapes in a warning (checked where the report exists).
    """
    _require("xla")
    xm = importlib.import_module("torch_xla.core.xla_model")
    metrics = importlib.import_module("torch_xla.debug.metrics")
    acc = impl.Accelerator()
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(FEATURES, 1))
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.01))
    for _ in range(3):  # warm-up: the first steps compile their graphs once
        _training_steps(acc, model, optimizer, xm, batch=8)
    settled = _compiles(metrics)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(STEPS):
            _training_steps(acc, model, optimizer, xm, batch=8)
        expect_equal(_compiles(metrics) - settled, 0, f"graphs compiled during {STEPS} more steps of the same shapes")
        _training_steps(acc, model, optimizer, xm, batch=5)
    expect_true(_compiles(metrics) > settled, "a step whose batch shrank from 8 to 5 rows should compile a new graph")
    if importlib.import_module("torch_xla").__version__.endswith("+sim"):  # the simulator's report
        reports = [str(w.message) for w in caught if "recompilation" in str(w.message).lower()]
        expect_equal(len(reports), 1, f"recompilation warnings for the one changed step: {reports}")
        expect_true("[8, 4]" in reports[0] and "[5, 4]" in reports[0], f"the report should name the old and new shapes: {reports[0]}")
