"""bf16/fp16 matrix ops on the mock GPU (:mod:`simulators.devices.kernels.lowp_matmul`): accumulated in fp32, rounded once,
results of the dtype asked for, counted in the books at that dtype (the fp32 temporaries are not).

The expected values are the fp32 op on upcast copies, rounded once. The CPU's own low-precision kernels give
other values for some of these inputs (fp16 ``mm``, ``addmm`` and convolutions; whether its bf16 kernels do depends
on the kernel it picks), and the test asks that some do, so a payload op that runs as given fails here. Probes run
in a rank on the mock CUDA device (``tests/simulators/devices/worlds.py``).
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cuda1():
    yield from device_world("cuda", "1")


# -- probes (run in the rank) ------------------------------------------------------------


def products() -> dict:
    """Per op: whether the mock's result is the fp32 op on upcast inputs rounded once, its dtype, and the bytes
    the books grew by (now and at the peak) against the result's bytes at its dtype."""
    import torch

    aten = torch.ops.aten
    torch.manual_seed(0)
    found = {}

    def check(name, op, *inputs):
        host = [value.cpu() if isinstance(value, torch.Tensor) else value for value in inputs]
        dtype = host[0].dtype
        wide = [value.float() if isinstance(value, torch.Tensor) else value for value in host]
        expected = op(*wide).to(dtype)
        op(*inputs)  # once first: the library workspaces a GPU allocates at its first product (cuda_libraries)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = op(*inputs)
        grew, peak = torch.cuda.memory_allocated() - before, torch.cuda.max_memory_allocated() - before
        found[name] = {
            "rounded once from fp32": torch.equal(result.cpu(), expected),
            "the CPU's own kernel differs": not torch.equal(op(*host), expected),
            "dtype": str(result.dtype),
            "device": str(result.device),
            "books grew by the result's bytes": grew == peak == result.numel() * result.element_size(),
        }

    bf16, fp16 = torch.bfloat16, torch.float16
    a, b = torch.randn(64, 512, device="cuda"), torch.randn(512, 48, device="cuda")
    batch_a, batch_b = torch.randn(4, 64, 512, device="cuda"), torch.randn(4, 512, 48, device="cuda")
    check("bf16 mm", aten.mm.default, a.to(bf16), b.to(bf16))
    check("bf16 bmm", aten.bmm.default, batch_a.to(bf16), batch_b.to(bf16))
    check("bf16 baddbmm", aten.baddbmm.default, torch.randn(4, 64, 48, device="cuda", dtype=bf16), batch_a.to(bf16), batch_b.to(bf16))
    check("fp16 mm", aten.mm.default, a.to(fp16), b.to(fp16))
    check("fp16 addmm", aten.addmm.default, torch.randn(48, device="cuda", dtype=fp16), a.to(fp16), b.to(fp16))
    images, kernels = torch.randn(2, 16, 16, 16, device="cuda", dtype=fp16), torch.randn(8, 16, 3, 3, device="cuda", dtype=fp16)
    # oneDNN's fp16 convolution on a CPU with AVX512-FP16 (and AMX) accumulates in fp32 and rounds once, as the rule
    # does, so the rule's absence would not show there; the CPU's native kernel (oneDNN off) rounds as it goes.
    with torch.backends.mkldnn.flags(enabled=False):
        check("fp16 conv2d", lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), images, kernels)
    return found


def autocast_linear_and_backward() -> dict:
    """A Linear under bf16 autocast, forward (addmm) and backward (mm), against the fp32 ops rounded once."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 48).cuda()
    inputs = torch.randn(64, 512, device="cuda", requires_grad=True)
    with torch.autocast("cuda", torch.bfloat16):
        out = layer(inputs)
    grad = torch.randn(64, 48, device="cuda", dtype=torch.bfloat16)
    out.backward(grad)
    x, w, bias = (value.detach().cpu().bfloat16().float() for value in (inputs, layer.weight, layer.bias))
    return {
        "dtype": str(out.dtype),
        "forward": torch.equal(out.detach().cpu(), torch.addmm(bias, x, w.t()).bfloat16()),
        # the gradient of the bf16 input, rounded once, then cast back to the fp32 input (autocast's cast)
        "input gradient": torch.equal(inputs.grad.cpu(), (grad.cpu().float() @ w).bfloat16().float()),
        "weight gradient": torch.equal(layer.weight.grad.cpu(), (grad.cpu().float().t() @ x).bfloat16().float()),
    }


def mixed_dtypes_refused() -> str:
    """``mm`` of a bf16 and an fp32 matrix raises as the CPU's does (the rule upcasts nothing it would refuse)."""
    import torch

    try:
        torch.mm(torch.ones(2, 2, device="cuda", dtype=torch.bfloat16), torch.ones(2, 2, device="cuda"))
    except RuntimeError as error:
        return str(error)
    return "no error"


def out_dtype_products() -> dict:
    """``out_dtype`` products (CUDA-only kernels in torch): each equals the product of fp32 copies rounded once to
    ``out_dtype``, ``out=`` included (TRL accumulates ``acc += a @ b`` so)."""
    import torch

    torch.manual_seed(0)
    a = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 48, device="cuda", dtype=torch.bfloat16)
    acc = torch.randn(64, 48, device="cuda")
    expected = acc.cpu() + a.cpu().float() @ b.cpu().float()
    product = torch.mm(a, b, out_dtype=torch.float32)
    torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    return {"mm": (str(product.dtype), torch.equal(product.cpu(), a.cpu().float() @ b.cpu().float())),
            "addmm out": (str(acc.dtype), torch.allclose(acc.cpu(), expected, rtol=0, atol=1e-5))}


# -- tests ----------------------------------------------------------------------------------


def test_out_dtype_products_are_the_fp32_product_rounded_to_out_dtype(cuda1):
    assert cuda1.one(out_dtype_products) == {"mm": ("torch.float32", True), "addmm out": ("torch.float32", True)}


def test_low_precision_products_accumulate_in_fp32_and_round_once(cuda1):
    found = cuda1.one(products)
    for name, got in found.items():
        dtype = "torch.bfloat16" if name.startswith("bf16") else "torch.float16"
        differs = got.pop("the CPU's own kernel differs")
        assert got == {
            "rounded once from fp32": True, "dtype": dtype, "device": "cuda:0", "books grew by the result's bytes": True,
        }, name
        found[name] = differs
    assert found["fp16 mm"] and found["fp16 conv2d"], f"the CPU's own kernels round as the rule does: no test ({found})"


def test_autocast_linear_forward_and_backward_round_once(cuda1):
    assert cuda1.one(autocast_linear_and_backward) == {
        "dtype": "torch.bfloat16", "forward": True, "input gradient": True, "weight gradient": True,
    }


def test_mixed_dtypes_are_refused_as_on_the_cpu(cuda1):
    assert "same dtype" in cuda1.one(mixed_dtypes_refused)
