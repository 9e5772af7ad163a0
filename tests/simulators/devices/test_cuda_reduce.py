"""The staging buffer of torch's CUDA reductions split across blocks (``simulators/devices/memory/cuda_reduce.py``).

The expected sizes are the real H200's (``../shared/gpu/encoder.pickle``, ``transformer.pickle``,
``encoder_bf16.pickle``: each ``gpu_reduce_kernel`` allocation and the semaphores after it), and the
reductions the same snapshots run without one (``mlp.pickle``'s 16-row bias gradient, ``conv.pickle``'s
convolution bias gradient, the scalar losses).
"""
from __future__ import annotations

import pytest
import torch

from simulators.devices.memory import cuda_reduce
from tests.simulators.devices.worlds import device_world

H200 = {"multiprocessors": 132, "threads_per_multiprocessor": 2048}


def staging(shape: tuple, dtype: torch.dtype, dims: list | None, op: str = "sum") -> tuple[int, int]:
    tensor = torch.empty(shape, dtype=dtype, device="meta")
    space = cuda_reduce.iteration_space(tensor.shape, tensor.stride(), tensor.element_size(),
                                        range(len(shape)) if dims is None else dims, 4)
    load = 8 if tensor.element_size() == 2 and op == "sum" else 4
    config = cuda_reduce.launch_config(space, tensor.element_size(), 4, load, **H200)
    return config.global_memory_size, config.semaphore_size


@pytest.mark.parametrize("shape, dtype, dims, expected", [
    ((2048, 512), torch.float32, [0], (8_388_608, 16)),
    ((16, 128, 1536), torch.float32, [0, 1], (25_165_824, 48)),
    ((2048, 2048), torch.float32, [0], (33_554_432, 64)),
    ((16, 128, 8000), torch.bfloat16, [0, 1], (131_072_000, 252)),
], ids=["bias-512", "bias-1536", "bias-2048", "bias-8000-bf16"])
def test_a_bias_gradient_over_2048_tokens_takes_the_h200s_staging_buffer(shape, dtype, dims, expected):
    assert staging(shape, dtype, dims) == expected


@pytest.mark.parametrize("shape, dims", [
    ((16, 8192), [0]), ((16, 128, 64, 64), [0, 2, 3]), ((16, 2048), None), ((2048, 8000), [1]),
], ids=["16-row bias", "conv bias", "scalar loss", "rows (logsumexp)"])
def test_reductions_the_snapshots_run_without_a_buffer_get_none(shape, dims):
    assert staging(shape, torch.float32, dims) == (0, 0)


def test_the_iteration_space_puts_reduced_dimensions_first_and_merges_contiguous_ones():
    space = cuda_reduce.iteration_space((16, 128, 64, 64), (524288, 4096, 64, 1), 4, [0, 2, 3], 4)
    assert space.shape == (4096, 16, 128), space
    assert space.reduced == 2 and space.outputs == 128


def test_fewer_multiprocessors_split_into_fewer_blocks():
    tensor = torch.empty(2048, 8000, device="meta")  # 63 block columns: the H200's 2112 blocks give 34 to each
    space = cuda_reduce.iteration_space(tensor.shape, tensor.stride(), 4, [0], 4)
    l4 = cuda_reduce.launch_config(space, 4, 4, 4, multiprocessors=58, threads_per_multiprocessor=1536)
    h200 = cuda_reduce.launch_config(space, 4, 4, 4, **H200)
    assert 1 < l4.ctas_per_output < h200.ctas_per_output == 32


# -- on the mock GPU ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda1():
    yield from device_world("cuda", "1")


def bias_gradient_peak() -> dict:
    import torch

    grad = torch.ones(2048, 512, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    bias = grad.sum(0)
    return {"peak growth": torch.cuda.max_memory_allocated() - before, "result": bias.untyped_storage().nbytes(),
            "after": torch.cuda.memory_allocated() - before, "value": float(bias[0].item()),
            "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count}


def test_the_mock_gpu_holds_the_buffer_while_the_reduction_runs(cuda1):
    got = cuda1.one(bias_gradient_peak)
    assert got["peak growth"] >= 8_388_608, f"the staging buffer counts at the peak: {got}"
    assert got["after"] == got["result"] == 2048, f"and is freed when the kernel returns: {got}"
    assert got["value"] == 2048.0 and got["multiprocessors"] == 132, got
