"""No-compute mode of the mock devices (``SIMULATORS_NO_COMPUTE=1``): meta payloads, the same books, placeholders
for values, collectives that only check the ranks agree.

Probes turn the mode on in the rank (the mode is read when a payload is made) and off again before they return.
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cuda2():
    yield from device_world("cuda", "2")


@pytest.fixture
def fresh_cuda2():
    """A world of its own: a second process group in the same ranks may meet the first one's store keys."""
    yield from device_world("cuda", "2")


# -- probes (run in the rank) ------------------------------------------------------------


def _mode(on: bool) -> None:
    import os

    from simulators.devices.families.machine import NO_COMPUTE_ENV

    if on:
        os.environ[NO_COMPUTE_ENV] = "1"
    else:
        os.environ.pop(NO_COMPUTE_ENV, None)


def _train(wrap: str) -> dict:
    """Two AdamW steps of a small MLP under DDP or FSDP2: the peak above what the device held before, the devices
    of the payloads of the parameters, gradients and optimizer state after the first step, and the last loss."""
    import gc

    gc.collect()
    gc.disable()  # the collector frees cycles (autograd's, FSDP2's) at moments that differ from run to run
    try:
        return _steps(wrap)
    finally:
        gc.enable()


def _steps(wrap: str) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    else:
        mesh = init_device_mesh("cuda", (2,))  # unsharded parameters kept: with reshard_after_forward, the compute
        # mode's peak depends on when the collector frees a cycle holding one (64 KiB more with the collector off)
        fully_shard(model[0], mesh=mesh, reshard_after_forward=False)
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters())
    payloads = set()
    for step in range(2):
        loss = model(torch.randn(16, 64, device="cuda")).pow(2).mean()
        loss.backward()
        optimizer.step()
        if step == 0:
            tensors = [*model.parameters(), *(p.grad for p in model.parameters()),
                       *(v for state in optimizer.state.values() for v in state.values() if v.device.type == "cuda")]
            payloads |= {getattr(t, "_local_tensor", t)._payload.device.type for t in tensors}
        optimizer.zero_grad()
    return {"peak": torch.cuda.max_memory_allocated() - before, "payloads": sorted(payloads), "loss": loss.item()}


def training_steps_in_both_modes():
    import os

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group()
    try:
        _train("ddp")  # the workspaces the GPU libraries keep for the process (first matrix product of each thread)
        results = {}
        for wrap in ("ddp", "fsdp2"):
            for on in (False, True):
                _mode(on)
                results[f"{wrap} {'no-compute' if on else 'compute'}"] = _train(wrap)
        return results
    finally:
        _mode(False)
        dist.destroy_process_group()


def placeholders_and_runaway():
    import os

    import torch

    from simulators.devices.no_compute import meta_payloads
    from simulators.devices.memory import peaks

    os.environ["SIMULATORS_SCRIPT"] = __file__
    _mode(True)
    limit = meta_payloads.RUNAWAY_LIMIT
    try:
        total = torch.ones(3, device="cuda").sum()
        asked = [total.item(), bool(total), total.reshape(1).tolist(), f"{total:.1f}"]
        host = torch.ones(2, 3, device="cuda").cpu()
        asked.append([host.tolist(), host.untyped_storage().nbytes()])
        for _ in range(3):
            total.item()
        meta_payloads.RUNAWAY_LIMIT = 5
        try:
            for _ in range(10):
                total.item()
            runaway = ""
        except RuntimeError as error:
            runaway = str(error)
        mine = os.path.basename(__file__)
        placeholders = [entry for entry in peaks.RECORDER.report()["placeholders"] if entry["at"].startswith(mine)]
        return {"asked": asked, "placeholders": placeholders, "runaway": runaway}
    finally:
        meta_payloads.RUNAWAY_LIMIT = limit
        _mode(False)
        del os.environ["SIMULATORS_SCRIPT"]


def collectives_checked():
    import os

    import torch
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group()
    _mode(True)
    errors = {}
    try:
        agreed = torch.ones(4, device="cuda")
        dist.all_reduce(agreed)
        dist.all_to_all_single(torch.empty(2 + rank, device="cuda"), torch.empty(2 + rank, device="cuda"),
                               [1, 1 + rank], [1, 1 + rank])
        if rank == 0:
            dist.send(torch.ones(3, device="cuda"), 1)
        else:
            dist.recv(torch.empty(3, device="cuda"), 0)
        for name, call in {
            "shapes": lambda: dist.all_reduce(torch.ones(4 + rank, device="cuda")),
            "ops": lambda: dist.broadcast(agreed, 0) if rank == 0 else dist.all_reduce(agreed),
        }.items():
            try:
                call()
            except RuntimeError as error:
                errors[name] = str(error)
        return {"payload": agreed._payload.device.type, "errors": errors}
    finally:
        _mode(False)
        dist.destroy_process_group()


def kept_values():
    """Small integral tensors keep their values without compute: exchanged lengths read back, ops among them
    compute, an object gathered arrives whole; a float or a large integral tensor is meta, and a kept tensor an op
    writes from a meta one holds zeros."""
    import os

    import torch
    import torch.distributed as dist

    from simulators.devices.no_compute import meta_payloads
    from simulators.devices.memory import peaks

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group()
    os.environ["SIMULATORS_SCRIPT"] = __file__
    _mode(True)
    try:
        length = torch.full((1,), 128 + rank, dtype=torch.int64, device="cuda")
        lengths = [torch.zeros(1, dtype=torch.int64, device="cuda") for _ in range(2)]
        dist.all_gather(lengths, length)
        objects = [None, None]
        dist.all_gather_object(objects, {"rank": rank})
        large = torch.ones(meta_payloads.KNOWN_BYTES // 8 + 1, dtype=torch.int64, device="cuda")
        written = torch.full((2,), 7, dtype=torch.int64, device="cuda")
        written.add_(large[:2])
        mixed = torch.ones(2, device="cuda") * written
        mine = os.path.basename(__file__)
        return {"lengths": [value.item() for value in lengths], "objects": objects,
                "sums": torch.arange(6, device="cuda").reshape(2, 3).sum(1).tolist(),
                "payloads": [t._payload.device.type for t in (length, large, written, mixed, torch.ones(2, device="cuda"))],
                "written": written.tolist(), "float": torch.ones(3, device="cuda").sum().item(),
                "placeholders": sorted((entry["what"], entry["count"]) for entry in peaks.RECORDER.report()["placeholders"]
                                       if entry["at"].startswith(mine))}
    finally:
        _mode(False)
        del os.environ["SIMULATORS_SCRIPT"]
        dist.destroy_process_group()


# -- tests (run in pytest) -------------------------------------------------------------------


def test_a_training_step_without_compute_has_meta_payloads_and_the_same_books(cuda2):
    for got in cuda2.run(training_steps_in_both_modes):
        for wrap in ("ddp", "fsdp2"):
            computed, skipped = got[f"{wrap} compute"], got[f"{wrap} no-compute"]
            assert computed["payloads"] == ["cpu"] and skipped["payloads"] == ["meta"], (wrap, got)
            # DDP's books agree to the byte; FSDP2's within 516 bytes of 328 KB here (issue 23's goal: 2%)
            assert abs(skipped["peak"] - computed["peak"]) <= 0.01 * computed["peak"] and skipped["peak"] > 0, (wrap, got)
            assert skipped["loss"] == 0.0 != computed["loss"], (wrap, got)


def test_values_asked_for_are_placeholders_recorded_per_line_and_a_runaway_loop_stops(cuda2):
    for got in cuda2.run(placeholders_and_runaway):
        assert got["asked"] == [0.0, False, [0.0], "0.0", [[[0.0] * 3] * 2, 4]], got["asked"]
        asked = sorted((entry["what"], entry["count"]) for entry in got["placeholders"])
        # item, bool and format on one line; the copy; a loop of 3; the runaway loop (stopped at the 6th)
        assert asked == [("cpu copy", 1), ("item", 3), ("item", 3), ("item", 6), ("tolist", 1)], got["placeholders"]
        assert "test_no_compute.py:" in got["runaway"] and "--steps" in got["runaway"] and "5 times" in got["runaway"], got["runaway"]


def test_collectives_without_compute_move_nothing_and_name_ranks_that_disagree(fresh_cuda2):
    for rank, got in enumerate(fresh_cuda2.run(collectives_checked)):
        assert got["payload"] == "meta"
        assert "Detected mismatch between collectives on ranks" in got["errors"]["shapes"], got["errors"]
        assert "rank 0: allreduce_|float32|4; rank 1: allreduce_|float32|5" in got["errors"]["shapes"], got["errors"]
        assert "rank 0: broadcast_|float32|4; rank 1: allreduce_|float32|4" in got["errors"]["ops"], got["errors"]


def test_small_integral_tensors_keep_their_values_so_exchanged_lengths_read_back(fresh_cuda2):
    for rank, got in enumerate(fresh_cuda2.run(kept_values)):
        assert got["lengths"] == [128, 129] and got["objects"] == [{"rank": 0}, {"rank": 1}], got
        assert got["sums"] == [3, 12], got
        # kept, meta (past KNOWN_BYTES), kept (written from a meta one: zeros), meta (a float op), meta (a float)
        assert got["payloads"] == ["cpu", "meta", "cpu", "meta", "meta"], got["payloads"]
        assert got["written"] == [0, 0] and got["float"] == 0.0, got
        assert got["placeholders"] == [("item", 1)], got["placeholders"]  # the float's only


def test_an_8bit_quantization_without_values_has_no_outlier_columns_and_says_so():
    """bitsandbytes' LLM.int8() ops return outlier columns whose number depends on the values: without values,
    none, counted as a placeholder (``meta_payloads.WITHOUT_VALUES``)."""
    pytest.importorskip("bitsandbytes")
    import torch

    from simulators.devices.memory import peaks
    from simulators.devices.no_compute import meta_payloads

    A = torch.empty(4, 16, dtype=torch.float16, device="meta")
    rows, scales, outliers = meta_payloads.without_values(torch.ops.bitsandbytes.int8_vectorwise_quant.default, (A, 6.0), {})
    assert (rows.shape, rows.dtype, scales.shape, outliers.shape) == ((4, 16), torch.int8, (4,), (0,))
    CB = torch.empty(8, 16, dtype=torch.int8, device="meta")
    out, sub = meta_payloads.without_values(torch.ops.bitsandbytes.int8_mixed_scaled_mm.default, (A, rows, CB, scales, scales[:8], outliers), {})
    assert (out.shape, out.dtype, sub.numel()) == ((4, 8), torch.float16, 0)
    assert sum(count for (_, what), count in peaks.RECORDER.placeholders.items() if what.startswith("8-bit outlier")) >= 1
