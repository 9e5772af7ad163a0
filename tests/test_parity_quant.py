"""Issue 13's quantization and FP8 names behave as HF accelerate 1.15's do.

Each test runs accelerate_ref's name and HF's side by side on the same input
(HF accelerate is installed with the `hf` extra). bitsandbytes (extra ``bnb``)
and torchao (extra ``ao``) are real packages: their tests skip without them.
HF's bitsandbytes code needs a GPU where this reference quantizes on the CPU
(see `accelerate_ref.utils.bnb`): there the comparison stops where HF raises.
Catalog: quantization.load_and_quantize, plugin.unavailable_engines, env.checks.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import inspect
import json
import os
import stat
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

hf_utils = pytest.importorskip("accelerate.utils")

import accelerate.accelerator as hf_accelerator  # noqa: E402
import accelerate.utils.ao as hf_ao  # noqa: E402
import accelerate.utils.dataclasses as hf_dataclasses  # noqa: E402
import accelerate.utils.environment as hf_environment  # noqa: E402
import accelerate.utils.imports as hf_imports  # noqa: E402
import accelerate.utils.modeling as hf_modeling  # noqa: E402

import accelerate_ref.utils as ref_utils  # noqa: E402
from accelerate_ref.utils import ao as ref_ao  # noqa: E402
from accelerate_ref.utils import dataclasses as ref_dataclasses  # noqa: E402
from accelerate_ref.utils import imports as ref_imports  # noqa: E402
from accelerate_ref.utils._dataclasses import low_precision  # noqa: E402

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
needs_bnb = pytest.mark.skipif(not HAS_BNB, reason="bitsandbytes is not installed (extra bnb)")
needs_torchao = pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (extra ao)")

FP8_ENV = "ACCELERATE_FP8_"

#: FP8RecipeKwargs is deprecated in HF and here: building one (to_kwargs builds a default one) warns.
pytestmark = pytest.mark.filterwarnings("ignore:FP8RecipeKwargs is deprecated:FutureWarning")


@pytest.fixture(autouse=True)
def no_fp8_environment(monkeypatch):
    """Every test starts without ACCELERATE_FP8_* variables (the recipes read them)."""
    for key in [k for k in os.environ if k.startswith(FP8_ENV)]:
        monkeypatch.delenv(key)


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


# -- imports ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        "is_bnb_available()",
        "is_bnb_available('0.1')",
        "is_bnb_available(min_version='99.0')",
        "is_4bit_bnb_available()",
        "is_8bit_bnb_available()",
        "is_bitsandbytes_multi_backend_available()",
        "is_transformer_engine_mxfp8_available()",
        "is_torchao_available()",
    ],
)
def test_package_checks_answer_as_hf(call):
    answer = eval(f"ref.{call}", {"ref": ref_utils})
    assert isinstance(answer, bool) and answer == bool(eval(f"hf.{call}", {"hf": hf_imports}))  # HF may answer None for False


def test_bnb_checks_without_bitsandbytes(monkeypatch):
    monkeypatch.setattr(ref_imports, "_is_package_available", lambda name: name != "bitsandbytes")
    checks = [ref_utils.is_bnb_available(), ref_utils.is_bnb_available("0.1"), ref_utils.is_4bit_bnb_available()]
    assert checks + [ref_utils.is_8bit_bnb_available(), ref_utils.is_bitsandbytes_multi_backend_available()] == [False] * 5


def test_mxfp8_asks_transformer_engine(monkeypatch, tmp_path):
    """With TransformerEngine installed, its own check_mxfp8_support() answers."""
    package = tmp_path / "transformer_engine" / "pytorch"
    package.mkdir(parents=True)
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "fp8.py").write_text("def check_mxfp8_support():\n    return SUPPORTED, 'why'\nSUPPORTED = True\n")
    metadata = tmp_path / "transformer_engine-1.0.dist-info" / "METADATA"  # installed, as HF's check requires
    metadata.parent.mkdir()
    metadata.write_text("Metadata-Version: 2.1\nName: transformer-engine\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert ref_utils.is_transformer_engine_mxfp8_available() is True
        import transformer_engine.pytorch.fp8 as fake

        monkeypatch.setattr(fake, "SUPPORTED", False)
        assert ref_utils.is_transformer_engine_mxfp8_available() is False
    finally:
        for name in [m for m in list(sys.modules) if m.startswith("transformer_engine")]:
            del sys.modules[name]


@pytest.mark.parametrize("available", [True, False])
def test_torchao_required_as_hf(monkeypatch, available):
    monkeypatch.setattr(ref_imports, "is_torchao_available", lambda: available)
    monkeypatch.setattr(hf_imports, "is_torchao_available", lambda: available)
    outcomes = []
    for decorator in (ref_utils.torchao_required, hf_imports.torchao_required):

        @decorator
        def double(x: int) -> int:
            """Twice x."""
            return 2 * x

        try:
            outcomes.append((double.__name__, double.__doc__, double(21)))
        except ImportError as error:
            outcomes.append((double.__name__, double.__doc__, str(error)))
    assert outcomes[0] == outcomes[1]


@pytest.fixture(autouse=True)
def fresh_fp8_capability():
    """Both libraries cache check_cuda_fp8_capability for the process: each test asks afresh."""
    for check in (ref_utils.check_cuda_fp8_capability, hf_environment.check_cuda_fp8_capability):
        check.cache_clear()
    yield
    for check in (ref_utils.check_cuda_fp8_capability, hf_environment.check_cuda_fp8_capability):
        check.cache_clear()


def _fake_nvidia_smi(directory, output: str) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("output", ["9.0\\n8.0\\n", "8.6\\n", "8.9\\n", "12.0\\n"])
def test_fp8_capability_from_nvidia_smi_as_hf(monkeypatch, tmp_path, output):
    _fake_nvidia_smi(tmp_path, output)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ref_utils.check_cuda_fp8_capability() is hf_environment.check_cuda_fp8_capability()


def test_fp8_capability_falls_back_to_torch_as_hf(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert ref_utils.check_cuda_fp8_capability() is hf_environment.check_cuda_fp8_capability() is False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert ref_utils.check_cuda_fp8_capability() is False  # cached, as HF's
    ref_utils.check_cuda_fp8_capability.cache_clear()
    hf_environment.check_cuda_fp8_capability.cache_clear()
    assert ref_utils.check_cuda_fp8_capability() is hf_environment.check_cuda_fp8_capability() is True


# -- enums and recipes -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["CustomDtype", "FP8BackendType"])
def test_enums_as_hf(name):
    ref, hf = getattr(ref_dataclasses, name), getattr(hf_dataclasses, name)
    assert [(m.name, m.value) for m in ref] == [(m.name, m.value) for m in hf]
    assert issubclass(ref, str) is issubclass(hf, str)


@pytest.mark.parametrize("dtype", ["INT2", "INT4", "FP8"])
def test_custom_dtype_sizes_as_hf(dtype):
    ref_size = ref_utils.dtype_byte_size(getattr(ref_utils.CustomDtype, dtype))
    assert ref_size == hf_modeling.dtype_byte_size(getattr(hf_dataclasses.CustomDtype, dtype))


@pytest.mark.parametrize("name", ["AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs"])
def test_recipe_fields_as_hf(name):
    ref, hf = getattr(ref_dataclasses, name), getattr(hf_dataclasses, name)
    assert [(f.name, f.default) for f in dataclasses.fields(ref)] == [(f.name, f.default) for f in dataclasses.fields(hf)]
    parameters = [inspect.signature(c).parameters.values() for c in (ref, hf)]
    assert [[(p.name, p.kind, p.default) for p in each] for each in parameters][0] == [(p.name, p.kind, p.default) for p in parameters[1]]


@pytest.fixture
def with_transformer_engine(monkeypatch):
    """Both libraries believe TransformerEngine installed (the recipe is plain data; only this check needs TE)."""
    monkeypatch.setattr(low_precision, "is_transformer_engine_available", lambda: True)
    monkeypatch.setattr(hf_dataclasses, "is_transformer_engine_available", lambda: True)


def _both(name: str, **kwargs):
    """(ours, HF's) recipe ``name`` built with ``kwargs``, or the exception class each raised."""
    built = []
    for module in (ref_dataclasses, hf_dataclasses):
        try:
            with pytest.warns(FutureWarning) if name == "FP8RecipeKwargs" else contextlib.nullcontext():
                built.append(getattr(module, name)(**kwargs))
        except (ImportError, ValueError) as error:
            built.append(type(error))
    return built


def _same(ref, hf) -> None:
    if isinstance(ref, type):
        assert ref is hf
    else:
        assert ref.to_dict() == hf.to_dict()
        assert ref.to_kwargs() == hf.to_kwargs()


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TransformerEngine is installed")
@pytest.mark.parametrize("name", ["TERecipeKwargs", "FP8RecipeKwargs"])
def test_transformer_engine_recipes_refused_without_it_as_hf(name):
    assert _both(name) == [ImportError, ImportError]


TE_CASES = [
    ({}, {}),
    ({}, {"MARGIN": "2", "INTERVAL": "3", "FORMAT": "e4m3", "AMAX_HISTORY_LEN": "16", "AMAX_COMPUTE_ALGO": "MAX"}),
    ({}, {"OVERRIDE_DGRAD": "1", "USE_MXFP8_BLOCK_SCALING": "true", "USE_AUTOCAST_DURING_EVAL": "yes"}),
    ({"fp8_format": "e5m2", "margin": 1, "override_linear_precision": (True, False, True)}, {"FORMAT": "E4M3"}),
    ({"fp8_format": "FP16"}, {}),
    ({"amax_compute_algo": "mean"}, {}),
    ({}, {"FORMAT": "bogus"}),
]


@pytest.mark.parametrize(("kwargs", "env"), TE_CASES)
@pytest.mark.parametrize("name", ["TERecipeKwargs", "FP8RecipeKwargs"])
def test_transformer_engine_recipes_as_hf(with_transformer_engine, monkeypatch, name, kwargs, env):
    for key, value in env.items():
        monkeypatch.setenv(FP8_ENV + key, value)
    _same(*_both(name, **kwargs))


@pytest.mark.parametrize(
    ("kwargs", "env"),
    [({}, {}), ({"backend": "msamp"}, {}), ({}, {"BACKEND": "MSAMP"}), ({"backend": "AO"}, {}), ({"backend": "fp9"}, {})],
)
def test_fp8_recipe_backend_as_hf(with_transformer_engine, monkeypatch, kwargs, env):
    for key, value in env.items():
        monkeypatch.setenv(FP8_ENV + key, value)
    ref, hf = _both("FP8RecipeKwargs", **kwargs)
    _same(ref, hf)
    if not isinstance(ref, type):
        assert ref.opt_level is hf.opt_level is None  # HF runs only the TransformerEngine rules


def test_unknown_fp8_backend_refused_before_transformer_engine_is_asked():
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="backend"):
        ref_utils.FP8RecipeKwargs(backend="nonsense")


@pytest.mark.parametrize(("kwargs", "env"), [({}, {}), ({}, {"OPT_LEVEL": "O1"}), ({"opt_level": "O3"}, {}), ({}, {"OPT_LEVEL": "o1"})])
def test_msamp_recipe_as_hf(monkeypatch, kwargs, env):
    for key, value in env.items():
        monkeypatch.setenv(FP8_ENV + key, value)
    _same(*_both("MSAMPRecipeKwargs", **kwargs))


def test_ao_recipe_refused_without_torchao_as_hf(monkeypatch):
    monkeypatch.setattr(low_precision, "is_torchao_available", lambda: False)
    monkeypatch.setattr(hf_dataclasses, "is_torchao_available", lambda: False)
    assert _both("AORecipeKwargs") == [ImportError, ImportError]


@needs_torchao
@pytest.mark.parametrize(
    ("kwargs", "env"),
    [({}, {}), ({"pad_inner_dim": False}, {}), ({}, {"PAD_INNER_DIM": "0", "ENABLE_FSDP_FLOAT8_ALL_GATHER": "false"})],
)
def test_ao_recipe_as_hf(monkeypatch, kwargs, env):
    for key, value in env.items():
        monkeypatch.setenv(FP8_ENV + key, value)
    ref, hf = _both("AORecipeKwargs", **kwargs)
    assert ref.config == hf.config
    _same(ref, hf)


@needs_torchao
def test_ao_recipe_keeps_a_given_config():
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig(emulate=True)
    ref, hf = _both("AORecipeKwargs", config=config, module_filter_func=ref_ao.filter_linear_layers)
    assert ref.config is config and ref.pad_inner_dim is None
    assert ref.to_dict().keys() == hf.to_dict().keys()


# -- Accelerator.fp8_backend -----------------------------------------------------------------------


def _hf_fp8_backend(handlers: dict, deepspeed_plugin=None):
    """HF's ``Accelerator.fp8_backend`` evaluated on an object holding these handlers as HF's Accelerator does."""
    attributes = {
        "FP8RecipeKwargs": "fp8_recipe_handler",
        "AORecipeKwargs": "ao_recipe_handler",
        "TERecipeKwargs": "te_recipe_handler",
        "MSAMPRecipeKwargs": "msamp_recipe_handler",
    }
    accelerator = SimpleNamespace(**dict.fromkeys(attributes.values()), state=SimpleNamespace(deepspeed_plugin=deepspeed_plugin))
    for handler in handlers.values():
        setattr(accelerator, attributes[type(handler).__name__], handler)
    accelerator.has_fp8_handler = bool(handlers)
    return hf_accelerator.Accelerator.fp8_backend.fget(accelerator)


def _recipes(name: str, **kwargs):
    """({class: recipe}, {class: recipe}) of ours and HF's; (None, None) where both refused alike."""
    ref, hf = _both(name, **kwargs)
    if isinstance(ref, type) or isinstance(hf, type):
        assert ref is hf
        return None, None
    return {type(ref): ref}, {type(hf): hf}


FP8_BACKEND_CASES = {
    "none": lambda: ({}, {}),
    "msamp-recipe": lambda: _recipes("MSAMPRecipeKwargs"),
    "fp8-recipe-msamp": lambda: _recipes("FP8RecipeKwargs", backend="MSAMP"),
    "fp8-recipe-te": lambda: _recipes("FP8RecipeKwargs"),
    "te-recipe": lambda: _recipes("TERecipeKwargs"),
}


@pytest.mark.parametrize("env", [None, "AO", "TE", "te"])
@pytest.mark.parametrize("case", list(FP8_BACKEND_CASES))
def test_fp8_backend_as_hf(with_transformer_engine, monkeypatch, case, env):
    if env is not None:
        monkeypatch.setenv("ACCELERATE_FP8_BACKEND", env)
    ref_handlers, hf_handlers = FP8_BACKEND_CASES[case]()
    if ref_handlers is None:  # the recipe itself was refused (ACCELERATE_FP8_BACKEND is FP8RecipeKwargs' backend too)
        return
    outcomes = []
    for backend in (lambda: low_precision.fp8_backend_of(ref_handlers), lambda: _hf_fp8_backend(hf_handlers)):
        try:
            outcomes.append(backend().value)
        except ValueError as error:
            outcomes.append(type(error))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("enable_msamp", [True, False])
def test_fp8_backend_from_deepspeed_plugin_as_hf(enable_msamp):
    plugin = SimpleNamespace(enable_msamp=enable_msamp)
    assert low_precision.fp8_backend_of({}, plugin).value == _hf_fp8_backend({}, plugin).value


@needs_torchao
def test_fp8_backend_ao_recipe_as_hf():
    ref_handlers, hf_handlers = _recipes("AORecipeKwargs")
    assert low_precision.fp8_backend_of(ref_handlers).value == _hf_fp8_backend(hf_handlers).value == "AO"


def test_accelerator_fp8_backend(fresh_accelerate_state):
    from accelerate_ref import Accelerator

    if not hasattr(Accelerator, "fp8_backend"):
        pytest.skip("Accelerator.fp8_backend is added by the lead at merge time")
    assert Accelerator().fp8_backend == ref_utils.dataclasses.FP8BackendType.NO


# -- utils.ao --------------------------------------------------------------------------------------


class Mixed(nn.Module):
    """Linear layers of which some have a dimension that is no multiple of 16."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(32, 64)
        self.odd = nn.Linear(64, 40)
        self.inner = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64))
        self.last = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.inner(self.odd(self.first(x))))


def test_layer_filters_as_hf():
    model = Mixed()
    assert ref_ao.find_first_last_linear_layers(model) == hf_ao.find_first_last_linear_layers(model) == ("first", "last")
    assert ref_ao.find_first_last_linear_layers(nn.ReLU()) == hf_ao.find_first_last_linear_layers(nn.ReLU())
    for filter_out in ([], ["first", "last"], ["inner.2"]):
        for fqn, module in model.named_modules():
            ref = ref_ao.filter_linear_layers(module, fqn, layers_to_filter=filter_out)
            assert ref is hf_ao.filter_linear_layers(module, fqn, layers_to_filter=filter_out), (fqn, filter_out)
    for fqn, module in model.named_modules():
        ref = ref_ao.filter_first_and_last_linear_layers(module, fqn)
        assert ref is hf_ao.filter_first_and_last_linear_layers(module, fqn), fqn


def test_ao_conversion_refused_without_torchao(monkeypatch):
    monkeypatch.setattr(ref_imports, "is_torchao_available", lambda: False)
    for function in (ref_ao.convert_model_to_fp8_ao, ref_ao.has_ao_layers):
        with pytest.raises(ImportError, match="torchao"):
            function(Mixed())


def _converted(convert, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    model = Mixed()
    convert(model, **kwargs)
    return model


@needs_torchao
@pytest.mark.parametrize("filter_name", [None, "first_and_last", "everything"])
def test_ao_conversion_as_hf(filter_name):
    """The same layers become torchao Float8Linear, and ours computes exactly what HF's does, forward and backward."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    filters = {None: None, "first_and_last": ref_ao.filter_first_and_last_linear_layers, "everything": lambda m, fqn: True}
    kwargs = {"config": Float8LinearConfig(), "module_filter_func": filters[filter_name]}
    ref, hf = _converted(ref_ao.convert_model_to_fp8_ao, **kwargs), _converted(hf_ao.convert_model_to_fp8_ao, **kwargs)
    fp8 = [name for name, module in ref.named_modules() if isinstance(module, Float8Linear)]
    assert fp8 == [name for name, module in hf.named_modules() if isinstance(module, Float8Linear)]
    assert fp8 and ref_ao.has_ao_layers(ref) and hf_ao.has_ao_layers(ref)
    assert not ref_ao.has_ao_layers(Mixed())
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    ref_out, hf_out = ref(x), hf(x)
    assert torch.equal(ref_out, hf_out)
    ref_out.square().mean().backward()
    hf_out.square().mean().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), hf.parameters()))
    if filter_name is None:  # the default leaves the first, the last and the Linear layers sized 40 alone
        assert fp8 == ["inner.2"]


# -- utils.bnb -------------------------------------------------------------------------------------


@needs_bnb
@pytest.mark.parametrize("cls", [Net, TiedNet, BaseNet, WrappedNet])
def test_keys_to_not_convert_as_hf(cls):
    from accelerate.utils import bnb as hf_bnb

    from accelerate_ref.utils import bnb as ref_bnb

    model = _net(cls=cls)
    assert sorted(ref_bnb.get_keys_to_not_convert(model)) == sorted(hf_bnb.get_keys_to_not_convert(model))


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


@pytest.mark.parametrize("mixed_precision", [None, "no", "bf16"])
def test_a_recipe_without_fp8_is_refused_as_hf(fresh_accelerate_state, mixed_precision):
    from accelerate.state import AcceleratorState as HFState

    from accelerate_ref import Accelerator

    errors = []
    for accelerator, recipe in ((Accelerator, ref_utils.MSAMPRecipeKwargs()), (hf_accelerator.Accelerator, hf_utils.MSAMPRecipeKwargs())):
        HFState._reset_state(True)
        with pytest.raises(ValueError) as caught:
            accelerator(mixed_precision=mixed_precision, kwargs_handlers=[recipe])
        errors.append(str(caught.value))
    HFState._reset_state(True)
    assert errors[0] == errors[1]


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
