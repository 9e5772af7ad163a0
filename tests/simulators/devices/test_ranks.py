"""The mock devices across ranks: ``xm`` collectives and the ``xla`` backend on 2 XLA replicas,
``hccl`` (gloo underneath) and DDP on 2 NPUs.

Every rank's input differs, so a collective that drops, reorders or sums
where it should concatenate shows up.
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def xla2():
    yield from device_world("xla", "2")


@pytest.fixture(scope="module")
def npu2():
    yield from device_world("npu", "2")


# -- probes (run in every rank) ---------------------------------------------------------------


def xm_collectives():
    import os

    import torch
    import torch_xla.core.xla_model as xm

    rank = int(os.environ["RANK"])
    device = xm.xla_device()
    mine = torch.tensor([1.0 + rank, 10.0 * rank]).to(device)
    listed = [mine.clone()]
    xm.all_reduce(xm.REDUCE_SUM, listed, scale=0.5)
    block = torch.full((1, 2), float(rank)).to(device)
    shared = [torch.tensor([rank, rank]).to(device)]
    xm.collective_broadcast(shared, root_ordinal=1)
    return {
        "device": str(device),
        "sum": xm.all_reduce(xm.REDUCE_SUM, mine).tolist(),
        "max": xm.all_reduce(xm.REDUCE_MAX, mine).tolist(),
        "scaled list": listed[0].tolist(),
        "gather 0": xm.all_gather(block).tolist(),
        "gather 1": xm.all_gather(block, dim=1).tolist(),
        "broadcast": shared[0].tolist(),
        "rendezvous": xm.rendezvous("probe", b"x" * (rank + 1)),
        "mesh": xm.mesh_reduce("probe", {"rank": rank}, lambda every: [e["rank"] for e in every]),
        "on device": [xm.all_reduce(xm.REDUCE_SUM, mine).device.type, xm.all_gather(block).device.type],
    }


def xm_gather_of_different_shapes():
    import os

    import torch
    import torch_xla.core.xla_model as xm

    rank = int(os.environ["RANK"])
    try:
        xm.all_gather(torch.zeros(rank + 1).to(xm.xla_device()))
    except RuntimeError as error:
        return str(error)
    return None


def ddp_over_the_xla_backend():
    import os

    import torch
    import torch.distributed as dist
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_backend  # noqa: F401 (registers "xla" and xla://)

    rank = int(os.environ["RANK"])
    dist.init_process_group("xla", init_method="xla://")
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).to(torch_xla.device()))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.full((4, 2), float(rank + 1)).to(torch_xla.device())).pow(2).mean().backward()
        grads = [p.grad.cpu().tolist() for p in model.parameters()]
        optimizer.step()
        xm.mark_step()
        return {"backend": dist.get_backend(), "grads": grads, "weight": model.module.weight.detach().cpu().tolist()}
    finally:
        dist.destroy_process_group()


def hccl_and_ddp_on_npus():
    import os

    import torch
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    try:
        mine = torch.tensor([1.0 + rank]).npu()
        dist.all_reduce(mine)
        parts = [torch.zeros(1).npu() for _ in range(2)]
        dist.all_gather(parts, torch.tensor([float(rank)]).npu())

        class TwoHeads(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.unused = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)

            def forward(self, x):
                return self.used(x)

        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(TwoHeads().npu(), device_ids=[rank], find_unused_parameters=True)
        for _ in range(2):
            model(torch.full((3, 2), float(rank + 1)).npu()).sum().backward()
        return {
            "backend": dist.get_backend(),
            "sum": mine.tolist(),
            "gathered": [p.tolist() for p in parts],
            "devices": sorted({p.device.type for p in parts}),
            "grad": model.module.used.weight.grad.cpu().tolist(),
            "unused grad": model.module.unused.weight.grad is None,
        }
    finally:
        dist.destroy_process_group()


# -- tests (run in pytest) -------------------------------------------------------------------


def test_xm_collectives_across_two_replicas(xla2):
    ranks = xla2.run(xm_collectives)
    assert [r["device"] for r in ranks] == ["xla:0", "xla:1"]
    for got in ranks:
        assert got["sum"] == [3.0, 10.0] and got["max"] == [2.0, 10.0]
        assert got["scaled list"] == [1.5, 5.0], "reduced in place, then scaled"
        assert got["gather 0"] == [[0.0, 0.0], [1.0, 1.0]] and got["gather 1"] == [[0.0, 0.0, 1.0, 1.0]]
        assert got["broadcast"] == [1, 1]
        assert got["rendezvous"] == [b"x", b"xx"] and got["mesh"] == [0, 1]
        assert got["on device"] == ["xla", "xla"]


def test_xm_all_gather_of_different_shapes_names_them(xla2):
    for message in xla2.run(xm_gather_of_different_shapes):
        assert message and "replica 0: [1]" in message and "replica 1: [2]" in message


def test_ddp_trains_over_the_xla_process_group_backend(xla2):
    ranks = xla2.run(ddp_over_the_xla_backend)
    assert {r["backend"] for r in ranks} == {"xla"}
    assert ranks[0]["grads"] == ranks[1]["grads"], "DDP averages the gradients"
    assert ranks[0]["weight"] == ranks[1]["weight"]


def test_hccl_is_gloo_on_npu_tensors_and_ddp_finds_unused_parameters(npu2):
    ranks = npu2.run(hccl_and_ddp_on_npus)
    for got in ranks:
        assert got["backend"] == "hccl" and got["sum"] == [3.0]
        assert got["gathered"] == [[0.0], [1.0]] and got["devices"] == ["npu"]
        assert got["unused grad"] is True
    assert ranks[0]["grad"] == ranks[1]["grad"]


def ddp_freed_as_its_function_returns_after_the_last_backward():
    """DDP over hccl (gloo underneath) in a function that destroys the group and returns: its model, and with it
    DDP's Reducer, once the group's last owner, is freed with the GIL held. The gradient, and for each group the
    mock keeps once the function has returned, whether it is DDP's."""
    import os

    import torch
    import torch.distributed as dist

    from simulators.devices.families import backend

    rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")

    def train() -> tuple:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).npu(), device_ids=[rank])
        model(torch.ones(3, 2).npu()).sum().backward()
        gloo = model.process_group._get_backend(torch.device("npu"))
        dist.destroy_process_group()
        return model.module.weight.grad.cpu().tolist(), gloo

    grad, gloo = train()
    return grad, [group is gloo for group in backend._groups]


def all_gather_into_a_flat_tensor():
    import os

    import torch
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    try:
        flat = torch.empty(8, device="npu")
        dist.all_gather_into_tensor(flat, torch.full((2, 2), float(rank), device="npu"))
        return [flat.device.type, flat.tolist()]
    finally:
        dist.destroy_process_group()


def test_a_gloo_group_outlives_the_ddp_model_freed_after_it_was_destroyed(npu2):
    """The mock keeps the gloo group it made for hccl after DDP's Reducer, freed with the GIL held, let it go: had
    the Reducer freed it, the group's destructor would join a worker thread that waits for that GIL to drop the
    backward's last work, and under load the rank hung (simulators.devices.families.backend, ``_groups``)."""
    npu2.pool.close()  # a fresh port: see the next test
    ranks = npu2.run(ddp_freed_as_its_function_returns_after_the_last_backward, timeout=30.0)
    assert ranks[0][0] == ranks[1][0]
    assert [kept for _, kept in ranks] == [[True], [True]], "the destroyed world's gloo group, kept until the next"


def test_hccl_all_gather_into_tensor_takes_a_flat_output_like_hccl(npu2):
    # The previous probe made and destroyed a process group on this pool's MASTER_PORT;
    # a new one on the same port can rendezvous with the old store's teardown and hang.
    # Restarting the pool gives the ranks a fresh port.
    npu2.pool.close()
    for got in npu2.run(all_gather_into_a_flat_tensor):
        assert got == ["npu", [0.0] * 4 + [1.0] * 4]
