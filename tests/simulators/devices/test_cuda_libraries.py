"""What a GPU allocates that a CPU run does not, counted on the mock GPU: library workspaces, foreach optimizers,
autocast's cast cache, fused attention (``simulators/devices/memory/cuda_libraries.py``, ``autocast.py``, ``attention.py``).

A workspace lives as long as the process (a thread that ends hands its cuBLAS handle, and so the handle's
workspace, to the next thread), so the workspace probes run in fresh ranks.
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cuda1():
    yield from device_world("cuda", "1")


@pytest.fixture
def fresh():
    yield from device_world("cuda", "1")


# -- probes (run in the rank) ------------------------------------------------------------


def workspace_growth(capability: str, config: str | None, bias: bool) -> list[int]:
    """Bytes the device grows by beyond the result at the process's first matrix product, then at its second,
    then at the first in another thread while the first is alive (each thread has its own cuBLAS handle)."""
    import os
    import threading

    import torch

    os.environ["SIMULATORS_GPU_CAPABILITY"] = capability
    if config:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = config
    a, b = torch.ones(4, 4, device="cuda"), torch.ones(4, 4, device="cuda")
    bias_vector = torch.ones(4, device="cuda")
    grown = []

    def product():
        before = torch.cuda.memory_allocated()
        kept = torch.addmm(bias_vector, a, b) if bias else torch.mm(a, b)
        grown.append(torch.cuda.memory_allocated() - before - kept.untyped_storage().nbytes())

    product()
    product()
    other = threading.Thread(target=product)
    other.start()
    other.join(60)
    return grown


def optimizer_kernels() -> list[bool]:
    import torch
    from torch.optim.optimizer import _default_to_fused_or_foreach

    parameters = list(torch.nn.Linear(2, 2).to("cuda").parameters())
    return list(_default_to_fused_or_foreach(parameters, differentiable=False, use_fused=False))


def cast_cache() -> dict:
    import torch

    layer = torch.nn.Linear(1024, 1024, bias=False).to("cuda")
    x = torch.ones(1, 1024, device="cuda")
    layer(x)  # this thread's cuBLAS workspace, before the count starts
    held = {}
    start = torch.cuda.memory_allocated()
    with torch.autocast("cuda", torch.bfloat16):
        first = layer(x)
        held["after one use"] = torch.cuda.memory_allocated() - start
        second = layer(x)
        held["after two uses"] = torch.cuda.memory_allocated() - start
    held["after the region"] = torch.cuda.memory_allocated() - start
    with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
        third = layer(x)
        held["uncached use"] = torch.cuda.memory_allocated() - start
    del first, second, third
    return held


def attention_memory_and_values() -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    batch, heads, length, dim = 2, 4, 64, 32
    q, k, v = (torch.randn(batch, heads, length, dim) for _ in range(3))
    on_gpu = [t.to("cuda").requires_grad_() for t in (q, k, v)]
    before = torch.cuda.memory_allocated()
    out = F.scaled_dot_product_attention(*on_gpu, dropout_p=0.1)
    held = torch.cuda.memory_allocated() - before
    out.sum().backward()
    plain = [t.to("cuda").requires_grad_() for t in (q, k, v)]
    exact = F.scaled_dot_product_attention(*plain)
    exact.sum().backward()
    reference = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*reference).sum().backward()
    halves = [t.bfloat16() for t in (q, k, v)]
    in_bf16 = F.scaled_dot_product_attention(*(t.to("cuda") for t in halves))
    return {
        "held after forward": held,
        "output": out.untyped_storage().nbytes(),
        "log-sum-exp": batch * heads * length * 4,
        "attention matrix": batch * heads * length * length * 4,
        "values": torch.equal(exact.cpu(), F.scaled_dot_product_attention(q, k, v)),
        "bf16 accumulated in fp32, rounded once": torch.equal(
            in_bf16.cpu(), F.scaled_dot_product_attention(*(t.float() for t in halves)).bfloat16()),
        "gradients": all(torch.allclose(gpu.grad.cpu(), cpu.grad, atol=1e-6) for gpu, cpu in zip(plain, reference)),
        "dropout gradients": [str(t.grad.device) for t in on_gpu],
    }


# -- tests (run in pytest) -------------------------------------------------------------------


@pytest.mark.parametrize("capability, config, size", [
    ("9.0", None, 32 * 2**20), ("8.0", None, 4096 * 1024 * 2 + 16 * 1024 * 8), ("9.0", ":4096:8", 4096 * 1024 * 8),
], ids=["hopper", "ampere", "CUBLAS_WORKSPACE_CONFIG"])
def test_each_threads_first_matrix_product_takes_the_cublas_workspace_of_the_gpus_architecture(fresh, capability, config, size):
    assert fresh.one(workspace_growth, capability, config, False) == [size, 0, size]


def test_a_biased_product_takes_the_cublaslt_workspace_too(fresh):
    both = 32 * 2**20 + 2**20
    assert fresh.one(workspace_growth, "9.0", None, True) == [both, 0, both]


def test_optimizers_take_their_foreach_kernels_for_mock_gpu_parameters(cuda1):
    assert cuda1.one(optimizer_kernels) == [False, True], "(fused, foreach) as for CUDA parameters"


def test_autocast_keeps_one_cast_of_a_parameter_per_region_and_drops_it_at_the_regions_exit(cuda1):
    got = cuda1.one(cast_cache)
    weight_bf16 = 1024 * 1024 * 2
    use = 2 * 1024 * 2  # a use's bf16 output and its input's bf16 cast (saved for the weight's gradient)
    assert got["after one use"] == weight_bf16 + use, got
    assert got["after two uses"] == weight_bf16 + 2 * use, f"the second use reads the cached cast: {got}"
    assert got["after the region"] == 2 * use, f"the cast goes when the outermost region exits: {got}"
    assert got["uncached use"] == 3 * use, f"cache_enabled=False keeps no cast: {got}"


def test_attention_keeps_the_fused_kernels_output_and_log_sum_exp_with_cpu_values(cuda1):
    got = cuda1.one(attention_memory_and_values)
    assert got["held after forward"] == got["output"] + got["log-sum-exp"], (
        f"the GPU's kernel keeps the output and a float32 log-sum-exp, no {got['attention matrix']}-byte matrix: {got}")
    assert got["values"] and got["gradients"] and got["bf16 accumulated in fp32, rounded once"], got
    assert got["dropout gradients"] == ["cuda:0"] * 3
