"""Lazy host tensors (issue 33, item 4): in no-compute mode the large CPU tensors a script makes carry meta payloads
too (:mod:`simulators.devices.no_compute.lazy_host`), so a model built on the CPU before ``prepare`` takes no host memory.

Probes run in a rank of a mock-GPU world and turn no-compute mode on there (and off again before they return); the
last test dry-runs a small Llama built on the CPU both ways and compares the summaries' books.
"""
from __future__ import annotations

import importlib.util
import json

import pytest

from simulators.fork_root import run_module
from tests.simulators.devices.worlds import device_world

pytestmark = pytest.mark.timeout(240)

MIB = 1 << 20


@pytest.fixture(scope="module")
def cuda1():
    yield from device_world("cuda", "1")


@pytest.fixture
def cuda2():
    yield from device_world("cuda", "2")


# -- probes (run in the rank) ------------------------------------------------------------


def _mode(on: bool) -> None:
    import os

    from simulators.devices.families.machine import NO_COMPUTE_ENV

    if on:
        os.environ[NO_COMPUTE_ENV] = "1"
        os.environ["SIMULATORS_SCRIPT"] = __file__  # placeholders are recorded at this file's lines
    else:
        os.environ.pop(NO_COMPUTE_ENV, None)
        os.environ.pop("SIMULATORS_SCRIPT", None)


def _placeholders() -> list:
    import os

    from simulators.devices.memory import peaks

    mine = os.path.basename(__file__)
    return sorted((entry["what"], entry["count"]) for entry in peaks.RECORDER.report()["placeholders"]
                  if entry["at"].startswith(mine))


def made_and_moved():
    """What the factories make on and below the threshold, a module built on the CPU, its state dict, its move to
    the GPU, mixing, values asked for, and the same factories with the mode off."""
    import torch

    from simulators.devices.memory import peaks

    peaks.RECORDER.placeholders.clear()
    _mode(True)
    try:
        got = {}
        big, small = torch.zeros(512, 1024), torch.arange(6.0)  # 2 MiB and 24 bytes
        got["kinds"] = [type(big).__name__, big.device.type, big.untyped_storage().device.type, type(small).__name__,
                        small.tolist()]
        got["factories"] = sorted({type(made).__name__ for made in (
            torch.empty(1 << 18), torch.ones(1 << 18, dtype=torch.float64), torch.randn(512, 1024), torch.rand(512, 1024),
            torch.full((512, 1024), 2.0), torch.arange(1 << 20), torch.randint(0, 5, (1 << 18,)), torch.eye(1024),
            small.new_zeros(1 << 18), torch.empty_strided((512, 1024), (1024, 1)), torch.zeros_like(big))})
        got["below"] = sorted({type(made).__name__ for made in (torch.empty((1 << 18) - 1), torch.ones(512, 511))})
        layer = torch.nn.Linear(1024, 1024)  # a 4 MiB weight (lazy), a 4 KiB bias (values)
        weight = layer.weight
        got["parameter"] = [type(weight).__name__, isinstance(weight, torch.nn.Parameter), weight.requires_grad,
                            weight.is_leaf, weight.device.type, type(layer.bias).__name__]
        got["view shares the storage"] = big[:10].untyped_storage()._cdata == big.untyped_storage()._cdata
        other, on_gpu = torch.zeros(512, 1024), torch.empty(512, 1024, device="cuda")
        got["pointers"] = [big.data_ptr() != 0, big.data_ptr() != other.data_ptr(), big[1].data_ptr() - big.data_ptr(),
                           on_gpu.data_ptr() != 0, on_gpu.data_ptr() != torch.empty_like(on_gpu).data_ptr()]
        del other, on_gpu
        got["data"] = [type(weight.data).__name__, weight.data.untyped_storage()._cdata == weight.untyped_storage()._cdata]
        layer.to(torch.bfloat16)
        got["cast"] = [layer.weight is weight, type(weight).__name__, str(weight.dtype), str(weight._payload.dtype)]
        layer.float()
        twin = torch.nn.Linear(1024, 1024)
        twin.load_state_dict(layer.state_dict())
        got["state dict"] = [type(value).__name__ for value in twin.state_dict().values()]

        before = torch.cuda.memory_allocated()
        layer.to("cuda")
        got["moved"] = [layer.weight is weight, type(weight).__name__, weight.device.type, weight._payload.device.type,
                        isinstance(weight, torch.nn.Parameter), torch.cuda.memory_allocated() - before]
        on_gpu = big.to("cuda", torch.bfloat16)
        got["to"] = [type(on_gpu).__name__, str(on_gpu.device), str(on_gpu.dtype), on_gpu._payload.device.type]
        try:
            layer(torch.randn(4, 1024, 1024))
            got["mixing"] = ""
        except RuntimeError as error:
            got["mixing"] = str(error)

        real = torch.ones(3)
        real.copy_(big[0, :3])
        asked = [big.sum().item(), big[0, :3].tolist(), f"{big.mean():.1f}", bool(big.max() > 1), real.tolist(),
                 big.numpy().shape]
        got["asked"] = asked
        got["placeholders"] = _placeholders()
        _mode(False)
        got["mode off"] = [type(torch.zeros(512, 1024)).__name__, type(torch.nn.Linear(1024, 1024).weight).__name__]
        return got
    finally:
        _mode(False)


def loaded(folder: str):
    """Files written with values, loaded in no-compute mode: ``torch.load`` (by path, mapped; from a stream; onto the
    GPU), ``safetensors.torch.load_file`` and, where transformers is installed, ``from_pretrained``."""
    import importlib.util
    import io
    import os

    import torch
    from safetensors.torch import load_file, save_file

    tied = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    small = torch.arange(5)
    state = {"big": tied, "tail": tied[-4:], "small": small, "small tail": small[3:],
             "half": torch.ones(512, 1024, dtype=torch.half)}
    torch.save(state, os.path.join(folder, "state.pt"))
    save_file({"big": torch.ones(512, 1024), "small": torch.arange(5)}, os.path.join(folder, "state.safetensors"))
    pretrained = importlib.util.find_spec("transformers") is not None
    if pretrained:  # a 2 MiB embedding, a 256-byte norm (ones)
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, vocab_size=8192)
        LlamaForCausalLM(config).save_pretrained(os.path.join(folder, "llama"))
    _mode(True)
    try:
        got = {}
        mapped = torch.load(os.path.join(folder, "state.pt"))
        got["by path"] = {name: type(value).__name__ for name, value in mapped.items()}
        got["small values"] = [mapped["small"].tolist(), mapped["small tail"].tolist(),
                               mapped["small tail"].untyped_storage()._cdata == mapped["small"].untyped_storage()._cdata]
        got["views stay views"] = mapped["tail"].untyped_storage()._cdata == mapped["big"].untyped_storage()._cdata
        got["shapes"] = [list(mapped["tail"].shape), mapped["tail"].storage_offset(), str(mapped["half"].dtype)]
        with open(os.path.join(folder, "state.pt"), "rb") as stream:
            got["stream"] = {name: type(value).__name__ for name, value in torch.load(io.BytesIO(stream.read())).items()}
        on_gpu = torch.load(os.path.join(folder, "state.pt"), map_location="cuda")
        got["onto the gpu"] = {name: [str(value.device), value._payload.device.type] for name, value in on_gpu.items()}
        got["small on the gpu"] = on_gpu["small tail"].tolist()
        tensors = load_file(os.path.join(folder, "state.safetensors"))
        got["safetensors"] = {name: type(value).__name__ for name, value in tensors.items()}
        got["safetensors small"] = tensors["small"].tolist()
        if pretrained:
            model = LlamaForCausalLM.from_pretrained(os.path.join(folder, "llama"))
            got["from_pretrained"] = [type(model.model.embed_tokens.weight).__name__, type(model.model.norm.weight).__name__,
                                      model.model.norm.weight[:2].tolist()]
        return got
    finally:
        _mode(False)


def ten_gigabytes_on_the_cpu():
    """A 10.7 GB model built on the CPU and moved to the GPU in no-compute mode, under an address-space limit of 2 GB
    more than the rank uses (were its tensors materialized, the first few would fail to allocate): the growth of
    the rank's resident memory, and what the GPU's books hold."""
    import gc
    import resource

    import torch

    def resident() -> int:
        with open("/proc/self/status") as stream:
            return next(int(line.split()[1]) * 1024 for line in stream if line.startswith("VmRSS:"))

    def address_space() -> int:
        with open("/proc/self/status") as stream:
            return next(int(line.split()[1]) * 1024 for line in stream if line.startswith("VmSize:"))

    limits = resource.getrlimit(resource.RLIMIT_AS)
    _mode(True)
    resource.setrlimit(resource.RLIMIT_AS, (address_space() + (2 << 30), limits[1]))
    try:
        before = resident()
        model = torch.nn.Sequential(*(torch.nn.Linear(16384, 16384) for _ in range(10)))  # 10 x 1 GiB + biases
        built = resident() - before
        held = torch.cuda.memory_allocated()
        model.to("cuda")
        moved = torch.cuda.memory_allocated() - held
        size = sum(param.numel() * param.element_size() for param in model.parameters())
        grown = resident() - before
        del model
        gc.collect()
        return {"built": built, "grown": grown, "size": size, "moved": moved}
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)
        _mode(False)


def host_collectives():
    """Collectives of gloo on the host over lazy tensors: they agree or name the ranks that disagree."""
    import os

    import torch
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    _mode(True)
    try:
        weights = torch.ones(512, 1024)
        dist.broadcast(weights, 0)
        dist.all_reduce(weights)
        gathered = [torch.empty(512, 1024) for _ in range(2)]
        dist.all_gather(gathered, weights)
        try:
            dist.all_reduce(torch.ones(512 + rank, 1024))
            error = ""
        except RuntimeError as raised:
            error = str(raised)
        return {"kinds": sorted({type(t).__name__ for t in (weights, *gathered)}), "error": error}
    finally:
        _mode(False)
        dist.destroy_process_group()


def masked_attention(no_compute: bool) -> dict:
    """Fused attention (grouped-query, a causal mask of 4 KiB, which keeps its values in no-compute mode) and its
    backward: the memory it holds, its peak, and the results' and gradients' layouts."""
    import torch
    import torch.nn.functional as F

    _mode(no_compute)
    try:
        query = torch.randn(2, 4, 64, 32, device="cuda", requires_grad=True)
        key, value = (torch.randn(2, 2, 64, 32, device="cuda", requires_grad=True) for _ in range(2))
        mask = torch.ones(64, 64, dtype=torch.bool, device="cuda").tril()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
        held = torch.cuda.memory_allocated() - before
        out.sum().backward()
        return {"meta": [tensor._payload.is_meta for tensor in (query, mask)], "held": held,
                "peak": torch.cuda.max_memory_allocated() - before,
                "layouts": [(tuple(t.shape), t.stride(), str(t.dtype), str(t.device))
                            for t in (out, query.grad, key.grad, value.grad)]}
    finally:
        _mode(False)


# -- tests (run in pytest) -------------------------------------------------------------------


def test_large_cpu_tensors_are_lazy_and_move_to_the_gpu_as_meta_payloads_counted_at_their_size(cuda1):
    got = cuda1.one(made_and_moved)
    assert got["kinds"] == ["LazyHostTensor", "cpu", "meta", "Tensor", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], got["kinds"]
    assert got["factories"] == ["LazyHostTensor"], got["factories"]
    assert got["below"] == ["Tensor"], got["below"]
    assert got["parameter"] == ["LazyHostTensor", True, True, True, "cpu", "Parameter"], got["parameter"]
    assert got["view shares the storage"] and got["data"] == ["LazyHostTensor", True], got
    # distinct storages, distinct pointers (a meta tensor's is 0), on the host and on the GPU; a view points into its storage
    assert got["pointers"] == [True, True, 1024 * 4, True, True], got["pointers"]
    assert got["cast"] == [True, "LazyHostTensor", "torch.bfloat16", "torch.bfloat16"], got["cast"]
    assert got["state dict"] == ["LazyHostTensor", "Tensor"], got["state dict"]
    # the module's parameter objects are kept; the GPU holds the weight and the bias at their sizes
    assert got["moved"] == [True, "CudaTensor", "cuda", "meta", True, 1024 * 1024 * 4 + 1024 * 4], got["moved"]
    assert got["to"] == ["CudaTensor", "cuda:0", "torch.bfloat16", "meta"], got["to"]
    assert "Expected all tensors to be on the same device" in got["mixing"] and "cuda:0 and cpu" in got["mixing"]
    assert got["asked"] == [0.0, [0.0, 0.0, 0.0], "0.0", False, [0.0, 0.0, 0.0], (512, 1024)], got["asked"]
    kinds = [what for what, _ in got["placeholders"]]
    assert sorted(set(kinds)) == ["cpu copy", "item", "numpy", "tolist"], got["placeholders"]
    assert got["mode off"] == ["Tensor", "Parameter"], got["mode off"]


def test_fused_attention_without_compute_holds_and_lays_out_what_it_does_with_compute(cuda1):
    computed, placeholders = cuda1.one(masked_attention, False), cuda1.one(masked_attention, True)
    assert computed["meta"] == [False, False] and placeholders["meta"] == [True, False], (
        f"payloads (query, mask) meta with compute {computed['meta']}, without {placeholders['meta']}")
    assert placeholders == {**computed, "meta": placeholders["meta"]}, (
        f"no-compute attention: {placeholders}, with compute: {computed}")


def test_loads_read_only_small_tensors_and_make_the_large_ones_lazy_keeping_views(cuda1, tmp_path):
    got = cuda1.one(loaded, str(tmp_path))
    assert got["by path"] == {"big": "LazyHostTensor", "tail": "LazyHostTensor", "small": "Tensor", "small tail": "Tensor",
                              "half": "LazyHostTensor"}, got["by path"]
    assert got["small values"] == [[0, 1, 2, 3, 4], [3, 4], True], got["small values"]  # copied out of the mapping once
    assert got["views stay views"] and got["shapes"] == [[4], (1 << 18) - 4, "torch.float16"], got
    assert got["stream"] == got["by path"], got["stream"]
    # the small integer tensors keep their values on the mock GPU (no_compute.KNOWN_BYTES), the others are meta
    kept = {"small", "small tail"}
    assert got["onto the gpu"] == {name: ["cuda:0", "cpu" if name in kept else "meta"] for name in got["by path"]}, got
    assert got["small on the gpu"] == [3, 4], got["small on the gpu"]
    assert got["safetensors"] == {"big": "LazyHostTensor", "small": "Tensor"} and got["safetensors small"] == [0, 1, 2, 3, 4]
    if "from_pretrained" in got:
        assert got["from_pretrained"] == ["LazyHostTensor", "Parameter", [1.0, 1.0]], got["from_pretrained"]


def test_collectives_on_lazy_host_tensors_compare_the_ranks_and_move_nothing(cuda2):
    for got in cuda2.run(host_collectives):
        assert got["kinds"] == ["LazyHostTensor"], got
        assert "Detected mismatch between collectives" in got["error"], got["error"]
        assert "rank 0: allreduce_|float32|512x1024; rank 1: allreduce_|float32|513x1024" in got["error"], got["error"]


def test_a_ten_gigabyte_cpu_model_takes_no_host_memory_without_compute(cuda1):
    got = cuda1.one(ten_gigabytes_on_the_cpu)
    assert got["size"] > 10 * 10**9, got
    assert got["moved"] == got["size"], got  # the GPU's books count every byte
    assert got["built"] < 64 * MIB and got["grown"] < 64 * MIB, got


# -- a small Llama built on the CPU, dry-run both ways ---------------------------------------

SCRIPT = """\
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

if sys.argv[1] == "accelerate":
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
else:
    from accelerate_ref import Accelerator
    from accelerate_ref.utils import FullyShardedDataParallelPlugin

plugins = {"ddp": {}, "fsdp2": {"fsdp_plugin": FullyShardedDataParallelPlugin(
    fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["LlamaDecoderLayer"])}}
accelerator = Accelerator(mixed_precision="bf16", **plugins[sys.argv[2]])
config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, vocab_size=32000)
model = LlamaForCausalLM(config)
print("embedding", type(model.model.embed_tokens.weight).__name__, "attention", type(model.model.layers[0].self_attn.q_proj.weight).__name__)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(2):
    batch = torch.randint(0, 32000, (1, 512), device=accelerator.device)
    loss = model(input_ids=batch, labels=batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
"""


def _dry_run(tmp_path, no_compute: bool, *arguments: str) -> tuple[list[dict], str]:
    script, summary = tmp_path / "train.py", tmp_path / f"summary-{no_compute}.json"
    script.write_text(SCRIPT)
    done = run_module("accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                      *(["--no-compute"] if no_compute else []), "--num_processes", "2", "--timeout", "300", "--summary-json", str(summary), str(script), *arguments, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return [rank["memory"] for rank in json.loads(summary.read_text())["ranks"]], done.stdout


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed (extra transformers)")
@pytest.mark.parametrize("impl, distributed", [  # HF's FSDP2 preparation (which maps parameters by data_ptr) in make test
    pytest.param("accelerate_ref", "ddp", marks=pytest.mark.extended), ("accelerate", "fsdp2")])
def test_a_small_llama_built_on_the_cpu_has_the_same_books_with_and_without_compute(tmp_path, impl, distributed):
    """The books of both modes agree to the byte (peak, reserved, parts, model states, step and line), and the
    no-compute run did build its large tensors lazily (the 31 MiB embedding; the 256 KiB projections keep values).
    HF accelerate's FSDP2 preparation maps the optimizer's parameters by ``data_ptr()``. The attention is
    transformers' default, sdpa: the mock GPU's fused attention lays its output out as the GPU's kernel does in
    both modes (torch's meta kernel would not, and ``transpose(1, 2).contiguous()`` then copied without compute)."""
    if importlib.util.find_spec(impl) is None:
        pytest.skip(f"{impl} is not installed")
    computed, computed_output = _dry_run(tmp_path, False, impl, distributed)
    estimated, estimated_output = _dry_run(tmp_path, True, impl, distributed)
    assert "embedding Parameter attention Parameter" in computed_output, computed_output[-2000:]
    assert "embedding LazyHostTensor attention Parameter" in estimated_output, estimated_output[-2000:]
    assert estimated == computed
