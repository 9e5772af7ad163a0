"""The mock CUDA device on a CPU-only torch: ``torch.cuda``, ``cuda`` tensors, ``nccl`` served by gloo.

Probes run in ranks whose import path starts with the stand-in (see
``tests/simulators/devices/worlds.py``); a script's dry run on it is in ``test_dryrun.py``.
"""
from __future__ import annotations

import pytest

from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cuda2():
    yield from device_world("cuda", "2")


# -- probes (run in the rank) ------------------------------------------------------------


def placement_and_mixing():
    import os
    import sys

    import torch

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    model = torch.nn.Linear(2, 1)
    weight = model.weight
    made = {
        "factory": torch.zeros(2, device="cuda"),
        "to": torch.ones(2).to("cuda"),
        "to device": torch.ones(2).to(torch.device("cuda")),
        "method": torch.ones(2).cuda(),
        "data": torch.tensor([1.0, 2.0], device="cuda"),
        "module": model.to("cuda").weight,
    }
    errors = {}
    for name, bad in {"mixing": lambda: made["to"] + torch.ones(2), "ordinal": lambda: torch.ones(1).to("cuda:2")}.items():
        try:
            bad()
        except RuntimeError as error:
            errors[name] = str(error)
    return {
        "autoloaded": "torch_cuda_sim" in sys.modules,
        "available": [torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.current_device()],
        "devices": {name: str(tensor.device) for name, tensor in made.items()},
        "is_cuda": made["method"].is_cuda,
        "same parameter": model.weight is weight,
        "errors": errors,
    }


def training_step_autocast_rng_and_memory():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).cuda()
    before = torch.cuda.memory_allocated()
    inputs = torch.randn(3, 4, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(inputs)
    out.float().sum().backward()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4.0)), batch_size=2, pin_memory=True)
    pinned = next(iter(loader))[0].to("cuda", non_blocking=True)
    torch.cuda.manual_seed(7)
    first = torch.randn(2, device="cuda").tolist()
    torch.cuda.manual_seed(7)
    again = torch.randn(2, device="cuda").tolist()
    return {
        "autocast dtype": str(out.dtype),
        "grad device": str(model.weight.grad.device),
        "memory grew": torch.cuda.memory_allocated() > before > 0,
        "rng": first == again,
        "pinned batch": [str(pinned.device), pinned.tolist()],
        "properties": torch.cuda.get_device_properties().major,
    }


def nccl_and_ddp():
    import os

    import torch
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group()  # on GPUs torch's default is nccl
    try:
        mine = torch.tensor([1.0 + rank]).cuda()
        dist.all_reduce(mine, group=dist.new_group([0, 1], backend="nccl"))
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).cuda(), device_ids=[rank])
        model(torch.full((3, 2), float(rank + 1), device="cuda")).sum().backward()
        return {
            "backend": dist.get_backend(),
            "sum": [mine.device.type, mine.tolist()],
            "grad": model.module.weight.grad.cpu().tolist(),
        }
    finally:
        dist.destroy_process_group()


def out_ops_views_vmap_and_attention():
    """Ops that resize their ``out=`` tensor or view ``self`` in place, vmap, attention and a transformers GPT-2,
    on the GPU against the CPU (the wrapper kept a 0-element size after ``torch.arange``: vmap failed, and
    transformers' mask silently vanished)."""
    import torch
    import transformers

    arange = torch.arange(4, device="cuda")
    resized = torch.empty(0, device="cuda").resize_(2, 3)
    transposed = torch.ones(2, 3, device="cuda").t_()
    queries, keys = torch.arange(3, device="cuda"), torch.arange(5, device="cuda")
    mask = torch.vmap(torch.vmap(lambda q, k: k <= q, in_dims=(None, 0)), in_dims=(0, None))(queries, keys)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    attention = {device: torch.nn.functional.scaled_dot_product_attention(q.to(device), k.to(device), v.to(device), is_causal=True)
                 for device in ("cpu", "cuda")}
    losses = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32))
        tokens = torch.randint(0, 100, (2, 16))
        padding = torch.ones(2, 16, dtype=torch.long)
        padding[1, 12:] = 0
        model.to(device)
        loss = model(input_ids=tokens.to(device), attention_mask=padding.to(device), labels=tokens.to(device)).loss
        loss.backward()
        losses[device] = [loss.item(), model.lm_head.weight.grad.norm().item()]
    return {
        "shapes": [list(arange.shape), arange.tolist(), list(resized.shape), list(transposed.shape), list(transposed.stride())],
        "mask": mask.tolist() == (keys.cpu()[None, :] <= queries.cpu()[:, None]).tolist(),
        "attention equal": torch.equal(attention["cpu"], attention["cuda"].cpu()),
        "losses": losses,
    }


def storage_resizes():
    """FSDP2's way of freeing an unsharded parameter it keeps, and of allocating it again: the storage resized in
    place (the books counted it until the tensor died: FSDP2's peaks were an unsharded layer too many)."""
    import torch

    held = torch.cuda.memory_allocated()
    parameter = torch.empty(1024, device="cuda")
    sizes = [torch.cuda.memory_allocated() - held]
    parameter.untyped_storage().resize_(0)
    sizes.append(torch.cuda.memory_allocated() - held)
    parameter.untyped_storage().resize_(4096)
    sizes.append(torch.cuda.memory_allocated() - held)
    return sizes


def reserved_memory_of_the_caching_allocator():
    """``torch.cuda``'s reserved memory is the caching allocator model's (issue 33, item 3): segments kept when their
    tensors die, released by ``empty_cache``, a new peak from ``reset_peak_memory_stats``, what ``mem_get_info`` counts
    as used; past the budget, out of memory when a segment cannot be reserved."""
    import os

    import torch

    torch.cuda.set_device(0)
    torch.cuda.empty_cache()
    start = torch.cuda.memory_reserved()
    large = torch.empty(3 * 2**20 - 100, device="cuda")  # 12 MiB less 400 bytes: a segment of 12 MiB (2 MiB steps)
    held = torch.cuda.memory_reserved() - start
    del large
    kept = torch.cuda.memory_reserved() - start
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()
    emptied = torch.cuda.memory_reserved() - start
    peak = torch.cuda.max_memory_reserved() - start
    os.environ["SIMULATORS_DEVICE_MEMORY"] = str(torch.cuda.memory_reserved() + 64 * 2**20)  # 64 MiB more than reserved
    try:
        free = torch.cuda.mem_get_info()[0]
        refused = None
        try:
            torch.empty(2 * free // 4, device="cuda")
        except torch.OutOfMemoryError as error:
            refused = str(error)
    finally:
        del os.environ["SIMULATORS_DEVICE_MEMORY"]
    return {"held": held, "kept after the free": kept, "after empty_cache": emptied, "peak since the reset": peak,
            "free": free, "refused": refused}


def moves_to_the_device_a_tensor_is_on():
    """What ``Tensor.to`` returns for the device a tensor is on: itself, as torch on a GPU, unless asked to copy or
    convert (a parameter stays the module's parameter, so HF's big-model hooks can tie it again)."""
    import torch

    torch.cuda.set_device(1)
    parameter = torch.nn.Parameter(torch.ones(2, device="cuda"))
    plain = torch.ones(2, device="cuda")
    return {
        "same object": [parameter.to(device) is parameter for device in ("cuda", "cuda:1", torch.device("cuda", 1))],
        "still a parameter": isinstance(parameter.to("cuda"), torch.nn.Parameter),
        "plain": [plain.to("cuda") is plain, plain.to(torch.float32) is plain, plain.to("cuda", copy=True) is plain],
        "converted": [str(plain.to(torch.float16).dtype), str(plain.to("cpu").device)],
    }


# -- tests (run in pytest) -------------------------------------------------------------------


def test_cuda_tensors_are_made_the_gpu_ways_and_mixing_with_the_cpu_raises(cuda2):
    for rank, got in enumerate(cuda2.run(placement_and_mixing)):
        assert got["autoloaded"] and got["available"] == [True, 2, rank]
        assert set(got["devices"].values()) == {f"cuda:{rank}"}, got["devices"]
        assert got["is_cuda"] and got["same parameter"]
        assert f"found at least two devices, cuda:{rank} and cpu!" in got["errors"]["mixing"]
        assert "invalid device ordinal: cuda:2" in got["errors"]["ordinal"]


def test_a_training_step_autocasts_seeds_and_counts_memory_on_the_gpu(cuda2):
    for got in cuda2.run(training_step_autocast_rng_and_memory):
        device = got["grad device"]
        assert device.startswith("cuda:")
        assert got == {
            "autocast dtype": "torch.bfloat16", "grad device": device, "memory grew": True, "rng": True,
            "pinned batch": [device, [0.0, 1.0]], "properties": 9,
        }


def test_a_storage_resized_in_place_is_counted_at_its_new_size(cuda2):
    assert cuda2.run(storage_resizes) == [[4096, 0, 4096]] * 2


def test_reserved_memory_is_the_caching_allocators_segments(cuda2):
    for got in cuda2.run(reserved_memory_of_the_caching_allocator):
        refused = got.pop("refused")
        assert got == {"held": 12 * 2**20, "kept after the free": 12 * 2**20, "after empty_cache": 0,
                       "peak since the reset": 12 * 2**20, "free": 64 * 2**20}
        assert refused.startswith("CUDA out of memory. Tried to allocate ") and "reserved in total by PyTorch" in refused


def test_nccl_the_default_and_named_is_gloo_on_cuda_tensors_and_reports_its_name(cuda2):
    ranks = cuda2.run(nccl_and_ddp)
    for got in ranks:
        assert got["backend"] == "nccl" and got["sum"] == ["cuda", [3.0]]
    assert ranks[0]["grad"] == ranks[1]["grad"]


def test_out_ops_inplace_views_vmap_and_attention_keep_shapes_and_cpu_values(cuda2):
    for got in cuda2.run(out_ops_views_vmap_and_attention):
        assert got["shapes"] == [[4], [0, 1, 2, 3], [2, 3], [3, 2], [1, 3]], got["shapes"]
        assert got["mask"] and got["attention equal"]
        assert got["losses"]["cuda"] == got["losses"]["cpu"], got["losses"]


def test_a_move_to_the_device_a_tensor_is_on_returns_the_tensor_as_torch_does(cuda2):
    assert cuda2.run(moves_to_the_device_a_tensor_is_on) == [{
        "same object": [True, True, True], "still a parameter": True, "plain": [True, True, False],
        "converted": ["torch.float16", "cpu"],
    }] * 2
