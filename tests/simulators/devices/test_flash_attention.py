"""FlashAttention's ops on mock GPU tensors and torch's context parallelism over them
(``simulators/devices/kernels/flash_attention.py``, the DTensor branch of ``attention.py``'s kernel)."""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cuda2():
    yield from device_world("cuda", "2")


def ring_attention_against_whole() -> dict:
    """Causal bf16 attention over a sequence split between the two ranks by torch's ``context_parallel`` (ring
    attention over the mock's flash op), against the same attention over the whole sequence on the CPU; and the
    gradients of the rank's query shard."""
    import os

    import torch
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group()
    try:
        return _ring_attention(rank)
    finally:
        dist.destroy_process_group()


def _ring_attention(rank: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16).bfloat16() for _ in range(3))
    whole = [t.clone().float().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*whole, is_causal=True)
    expected.sum().backward()
    _cp_options.enable_load_balance = False  # rank r holds rows [32 r, 32 r + 32): compared as such below
    mesh = init_device_mesh("cuda", (2,), mesh_dim_names=("cp",))
    buffers = [t.to("cuda") for t in (q, k, v)]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2], no_restore_buffers=set(buffers)):
        shards = [buffer.detach().requires_grad_() for buffer in buffers]
        out = F.scaled_dot_product_attention(*shards, is_causal=True)
        out.float().sum().backward()
    rows = slice(32 * rank, 32 * rank + 32)
    return {
        "shape": list(out.shape), "device": str(out.device),
        "output error": (out.float().cpu() - expected[:, :, rows].detach()).abs().max().item(),
        "query gradient error": (shards[0].grad.float().cpu() - whole[0].grad[:, :, rows]).abs().max().item(),
    }


def test_context_parallel_ring_attention_on_mock_gpus_matches_the_whole_sequences(cuda2):
    for rank, got in enumerate(cuda2.run(ring_attention_against_whole)):
        assert got["shape"] == [1, 2, 32, 16] and got["device"] == f"cuda:{rank}", got
        assert got["output error"] < 1e-2 and got["query gradient error"] < 1e-2, (
            f"rank {rank}: its half of the sequence, attended across both ranks' keys, as the whole sequence's: {got}")
