"""The process-group backend of the mock devices (``simulators/devices/families/backend.py``): functional collectives'
results on mock GPUs, as torch's DTensor gathers them."""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cuda2():
    yield from device_world("cuda", "2")


def gathered_dtensor() -> dict:
    """A 2-D-sharded DTensor (rows over 2 ranks, as FSDP2 over tensor parallelism lays one out) gathered whole, as
    ``save_pretrained`` gathers one before safetensors asks for its storage's address."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group()
    try:
        whole = torch.arange(64.0, device="cuda").reshape(16, 4)
        gathered = distribute_tensor(whole, init_device_mesh("cuda", (2,)), [Shard(0)]).full_tensor().contiguous()
        return {"type": type(gathered).__name__, "device": str(gathered.device), "storage": gathered.untyped_storage().data_ptr() != 0,
                "whole": torch.equal(gathered.cpu(), whole.cpu())}
    finally:
        dist.destroy_process_group()


def test_a_gathered_dtensor_is_a_device_tensor_with_a_storage(cuda2):
    for rank, got in enumerate(cuda2.run(gathered_dtensor)):
        assert got == {"type": "CudaTensor", "device": f"cuda:{rank}", "storage": True, "whole": True}, (
            f"rank {rank}: the functional all-gather's result must be the mock GPU's tensor (its AsyncCollectiveTensor "
            f"wrapping the device tensor, not its host payload), whose storage address safetensors reads: {got}")
