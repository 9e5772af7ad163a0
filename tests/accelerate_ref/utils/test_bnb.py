"""`accelerate_ref.utils.bnb`: quantization through the real bitsandbytes (extra ``bnb``) side by side with
HF accelerate 1.15 on the same input. HF's bitsandbytes code needs a GPU where this reference quantizes on the
CPU: there the comparison stops where HF raises.

Catalog: quantization.load_and_quantize.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import json
import os

import pytest
import torch
from torch import nn

import accelerate_ref.utils as ref_utils

hf_utils = pytest.importorskip("accelerate.utils")

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


needs_bnb = pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed (extra bnb)")


class Net(nn.Module):
    """Linear layers inside a Sequential, then a head: the last child is what bnb keeps by default."""

    def __init__(self, width: int = 32, out: int = 16) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        self.head = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class TiedNet(Net):
    """A language-model-like net: ``head.weight`` tied to ``embed.weight``."""

    def __init__(self) -> None:
        super().__init__(width=32, out=32)
        self.embed = nn.Embedding(32, 32)
        self.head.weight = self.embed.weight
        self.norm = nn.LayerNorm(32)


class BaseNet(Net):
    """A base model in transformers' sense: ``base_model_prefix`` names an attribute it lacks."""

    base_model_prefix = "model"


class WrappedNet(nn.Module):
    """A model with a head around its base: it has the attribute ``base_model_prefix`` names."""

    base_model_prefix = "model"

    def __init__(self) -> None:
        super().__init__()
        self.model = Net()
        self.lm_head = nn.Linear(16, 8)


def _net(seed: int = 0, cls: type = Net) -> nn.Module:
    torch.manual_seed(seed)
    return cls()


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.parametrize("cls", [Net, TiedNet, BaseNet, WrappedNet])
def test_keys_to_not_convert_as_hf(cls):
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb

    model = _net(cls=cls)
    assert sorted(ref_bnb.get_keys_to_not_convert(model)) == sorted(hf_bnb.get_keys_to_not_convert(model))


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.parametrize("load", ["load_in_8bit", "load_in_4bit"])
@pytest.mark.parametrize("not_convert", [None, ["head"], ["blocks"], ["blocks.2"], ["blocks.0", "head"]])
def test_replace_with_bnb_layers_as_hf(load, not_convert):
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb

    replaced = []
    for bnb_module, config_class in ((ref_bnb, ref_utils.BnbQuantizationConfig), (hf_bnb, hf_utils.BnbQuantizationConfig)):
        model = bnb_module.replace_with_bnb_layers(_net(), config_class(**{load: True}), modules_to_not_convert=not_convert)
        replaced.append({name: (type(m).__name__, type(m.weight).__name__, m.weight.data.clone(), m.weight.requires_grad)
                         for name, m in model.named_modules() if hasattr(m, "weight")})
    ref, hf = replaced
    assert ref.keys() == hf.keys()
    for name in ref:
        assert ref[name][:2] == hf[name][:2] and ref[name][3] == hf[name][3], name
        assert torch.equal(ref[name][2], hf[name][2]), name


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.parametrize(
    "kwargs",
    [
        {"load_in_8bit": True},
        {"load_in_4bit": True, "bnb_4bit_compute_dtype": "bf16", "bnb_4bit_quant_type": "nf4"},
        {"load_in_8bit": True, "torch_dtype": "fp32", "skip_modules": ["blocks.0"], "keep_in_fp32_modules": ["head"]},
        {"load_in_4bit": True, "llm_int8_threshold": 5.0},
    ],
)
def test_bnb_config_as_hf(kwargs):
    configs = []
    for config_class in (ref_utils.BnbQuantizationConfig, hf_utils.BnbQuantizationConfig):
        with pytest.warns(UserWarning) if "llm_int8_threshold" in kwargs else contextlib.nullcontext():
            configs.append(config_class(**copy.deepcopy(kwargs)))
    ref, hf = configs
    assert dataclasses.asdict(ref) == dataclasses.asdict(hf)
    assert str(ref.target_dtype) == str(hf.target_dtype)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.parametrize(
    "kwargs",
    [
        {"load_in_8bit": True},
        {"load_in_8bit": True, "skip_modules": ["blocks.2"], "keep_in_fp32_modules": ["head"]},
        {"load_in_4bit": True},
        {"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp32", "bnb_4bit_quant_type": "nf4"},
    ],
)
def test_load_and_quantize_a_loaded_model(kwargs):
    """As HF up to its move to a GPU (which raises here): same layers, dtypes and config; then quantized on the CPU."""
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb

    hf_model, hf_config = _net(), hf_utils.BnbQuantizationConfig(**copy.deepcopy(kwargs))
    with pytest.raises(RuntimeError, match="No GPU"):
        hf_bnb.load_and_quantize_model(hf_model, hf_config)  # converts in place, then asks for a GPU
    original, ref_config = _net(), ref_utils.BnbQuantizationConfig(**copy.deepcopy(kwargs))
    model = ref_bnb.load_and_quantize_model(copy.deepcopy(original), ref_config)
    assert (ref_config.skip_modules, ref_config.keep_in_fp32_modules) == (hf_config.skip_modules, hf_config.keep_in_fp32_modules)
    assert (model.is_loaded_in_8bit, model.is_loaded_in_4bit) == (hf_model.is_loaded_in_8bit, hf_model.is_loaded_in_4bit)
    hf_layers = {name: type(m) for name, m in hf_model.named_modules()}
    assert {name: type(m) for name, m in model.named_modules()} == hf_layers
    quantized = {name for name, m in model.named_modules() if type(m).__module__.startswith("bitsandbytes")}
    for name, param in model.named_parameters():
        if name.rpartition(".")[0] not in quantized or not name.endswith("weight"):
            assert param.dtype == dict(hf_model.named_parameters())[name].dtype, name
    assert ref_bnb.has_4bit_bnb_layers(model) is hf_bnb.has_4bit_bnb_layers(model) is bool(kwargs.get("load_in_4bit"))
    weights = {model.get_submodule(name).weight.dtype for name in quantized}
    assert weights == {torch.uint8 if kwargs.get("load_in_4bit") else torch.int8}  # quantized, not merely wrapped
    if ref_config.keep_in_fp32_modules:
        return  # a float32 head after float16 layers takes inputs it cannot multiply (on a GPU as well)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(3))
    error = (model(x.to(ref_config.torch_dtype)).float() - original(x)).abs().max().item()
    assert 0 < error < (0.1 if kwargs.get("load_in_4bit") else 0.02)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.parametrize("kwargs", [{"load_in_8bit": True, "torch_dtype": "fp32"}, {"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp32"}])
def test_load_and_quantize_from_a_checkpoint(tmp_path, kwargs):
    """A model built on the meta device is filled from ``weights_location`` with quantized weights (HF: on a GPU)."""
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref import init_empty_weights
    from accelerate_ref.utils import bnb as ref_bnb

    original = _net()
    torch.save(original.state_dict(), tmp_path / "pytorch_model.bin")
    for bnb_module, config_class in ((ref_bnb, ref_utils.BnbQuantizationConfig), (hf_bnb, hf_utils.BnbQuantizationConfig)):
        with init_empty_weights():
            empty = Net()
        with pytest.raises(RuntimeError, match="weights_location"):
            bnb_module.load_and_quantize_model(empty, config_class(**kwargs))
    with pytest.raises(RuntimeError, match="No GPU"):
        with init_empty_weights():
            hf_bnb.load_and_quantize_model(Net(), hf_utils.BnbQuantizationConfig(**kwargs), weights_location=tmp_path)
    with init_empty_weights():
        empty = Net()
    model = ref_bnb.load_and_quantize_model(empty, ref_utils.BnbQuantizationConfig(**kwargs), weights_location=tmp_path)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model.blocks[0].weight.dtype == (torch.int8 if "load_in_8bit" in kwargs else torch.uint8)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(3))
    error = (model(x).float() - original(x)).abs().max().item()
    assert 0 < error < (0.02 if "load_in_8bit" in kwargs else 0.1)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.parametrize(
    ("load", "device_map"),
    [
        ("load_in_8bit", {"": "cpu"}),
        ("load_in_8bit", {"blocks": "disk", "head": "cpu"}),
        ("load_in_4bit", {"blocks": "disk", "head": "cpu"}),
        ("load_in_4bit", {"blocks.0": "cpu", "blocks.2": "disk", "head": "cpu"}),
        ("load_in_4bit", {"blocks": "disk", "head": "disk"}),
        ("load_in_8bit", "balanced_and_bogus"),
        ("load_in_8bit", "sequential"),
        ("load_in_8bit", "auto"),
        ("load_in_8bit", "balanced_low_0"),
    ],
)
def test_quantized_model_device_map_as_hf(load, device_map):
    """Given maps as HF's (a quantized module on disk is refused for 4-bit); a strategy is inferred with quantized sizes."""
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb

    # 3200 bytes hold the model only with its quantized weights sized as int8 (~3.1 kB; ~12.8 kB in float32)
    for budget in (3200, 2500):
        outcomes = []
        for bnb_module, config_class in ((ref_bnb, ref_utils.BnbQuantizationConfig), (hf_bnb, hf_utils.BnbQuantizationConfig)):
            config = config_class(**{load: True}, skip_modules=["head"], keep_in_fp32_modules=[])
            try:
                outcomes.append(bnb_module.get_quantized_model_device_map(
                    _net(), config, copy.deepcopy(device_map), max_memory={"cpu": budget}))
            except ValueError as error:
                outcomes.append(type(error))
        assert outcomes[0] == outcomes[1]
        if device_map == "sequential":
            assert outcomes[0] == ({"": "cpu"} if budget == 3200 else {"blocks.0": "cpu", "blocks.1": "cpu", "blocks.2": "disk", "head": "disk"})


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
@pytest.mark.skipif(torch.cuda.is_available() or torch.xpu.is_available(), reason="an accelerator computes: the CPU offloads")
def test_cpu_is_the_compute_device_without_an_accelerator():
    """The deviation: where HF refuses a 4-bit module on "cpu" (it offloads from the GPU), a CPU-only machine computes there."""
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb

    device_map = {"blocks": "cpu", "head": "cpu"}
    with pytest.raises(ValueError, match="CPU or the disk"):
        hf_bnb.get_quantized_model_device_map(_net(), hf_utils.BnbQuantizationConfig(load_in_4bit=True, skip_modules=[], keep_in_fp32_modules=[]), device_map)
    config = ref_utils.BnbQuantizationConfig(load_in_4bit=True, skip_modules=[], keep_in_fp32_modules=[])
    assert ref_bnb.get_quantized_model_device_map(_net(), config, device_map) == device_map
    assert ref_bnb.get_quantized_model_device_map(_net(), config) == {"": "cpu"}


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
def test_parameter_device_as_hf():
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref import init_empty_weights
    from accelerate_ref.utils import bnb as ref_bnb

    with init_empty_weights():
        empty = Net()
    for model in (_net(), empty):
        assert ref_bnb.get_parameter_device(model) == hf_bnb.get_parameter_device(model)


def _index_and_files(folder) -> tuple[dict, dict]:
    from accelerate_ref.utils.offload import load_offloaded_weight

    with open(os.path.join(folder, "index.json")) as handle:
        index = json.load(handle)
    return index, {name: load_offloaded_weight(os.path.join(folder, f"{name}.dat"), info) for name, info in index.items()}


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
def test_offload_quantized_8bit_weight_as_hf(tmp_path):
    """With its statistics given, the quantized weight and its SCB are offloaded exactly as HF does; the module's weight is left on meta."""
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb
    from accelerate_ref.utils import save_offload_index

    weight = torch.randint(-127, 127, (32, 32), dtype=torch.int8)
    statistics = torch.rand(32, dtype=torch.float32)
    results = []
    for bnb_module, name, config_class in ((ref_bnb, "ref", ref_utils.BnbQuantizationConfig), (hf_bnb, "hf", hf_utils.BnbQuantizationConfig)):
        model, index = bnb_module.replace_with_bnb_layers(_net(), config_class(load_in_8bit=True)), {}
        os.makedirs(tmp_path / name)
        bnb_module.quantize_and_offload_8bit(model, weight, "blocks.0.weight", torch.int8, tmp_path / name, index, statistics)
        save_offload_index(index, tmp_path / name)
        assert model.blocks[0].weight.is_meta
        results.append(_index_and_files(tmp_path / name))
    (ref_index, ref_files), (hf_index, hf_files) = results
    assert ref_index == hf_index and ref_files.keys() == hf_files.keys() == {"blocks.0.weight", "blocks.0.SCB"}
    assert all(torch.equal(ref_files[key], hf_files[key]) for key in ref_files)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
def test_offload_8bit_quantizes_first(tmp_path):
    """Without statistics the weight is quantized first (HF on GPU 0; here on the CPU) and offloaded with its SCB."""
    from accelerate_ref.utils import bnb as ref_bnb
    from accelerate_ref.utils import save_offload_index

    model = ref_bnb.replace_with_bnb_layers(_net(), ref_utils.BnbQuantizationConfig(load_in_8bit=True))
    original = _net().blocks[0].weight.detach()
    index: dict = {}
    ref_bnb.quantize_and_offload_8bit(model, original, "blocks.0.weight", torch.float16, tmp_path, index, None)
    save_offload_index(index, tmp_path)
    _, files = _index_and_files(tmp_path)
    assert model.blocks[0].weight.is_meta
    assert files["blocks.0.weight"].dtype == torch.int8
    restored = files["blocks.0.weight"].float() * files["blocks.0.SCB"].float().unsqueeze(1) / 127
    assert (restored - original).abs().max().item() < 0.01


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_bnb
def test_8bit_weights_offloaded_to_disk_are_refused(tmp_path):
    """Not provided: 8-bit weights quantized while offloaded to disk (HF's offload_8bit_bnb); refused, never silently unquantized."""
    from accelerate_ref import init_empty_weights
    from accelerate_ref.utils import bnb as ref_bnb

    torch.save(_net().state_dict(), tmp_path / "pytorch_model.bin")
    with init_empty_weights():
        empty = Net()
    with pytest.raises(NotImplementedError, match="offload_8bit_bnb"):
        ref_bnb.load_and_quantize_model(
            empty, ref_utils.BnbQuantizationConfig(load_in_8bit=True), tmp_path, {"blocks": "disk", "head": "cpu"}, offload_folder=tmp_path / "off"
        )
