"""`accelerate_ref.utils.dataclasses`: enums, kwargs handlers, engine plugins and FP8 recipes, each as HF 1.15's.

Catalog: enums.values, kwargs.ddp, kwargs.init_process_group, accumulate.plugin,
autocast.fp16_scaler, plugin.dynamo, save_state.auto_naming, profile.context.

`MegatronLMPlugin` takes every field HF 1.15 documents, with the same environment defaults.

Catalog: plugin.unavailable_engines (validated as a dataclass; the engine itself is refused).

Unit tests of the engine plugin dataclasses, the FSDP wrap policy and the Accelerator's refusals.

Catalog: plugin.unavailable_engines, plugin.deepspeed_config, plugin.fsdp_wrap_policy, plugin.dynamo.
"""

import contextlib
import dataclasses
import enum
import importlib.util
import inspect
import json
from datetime import timedelta
from types import SimpleNamespace

import accelerate.accelerator as hf_accelerator  # noqa: E402
import accelerate.utils as hf_utils  # noqa: E402
import accelerate.utils.dataclasses as hf_dataclasses  # noqa: E402
import accelerate.utils.modeling as hf_modeling  # noqa: E402
import pytest
import torch

import accelerate_ref
import accelerate_ref.utils as ref_utils  # noqa: E402
import accelerate_ref.utils as utils
from accelerate_ref.utils import (
    AutocastKwargs,
    BnbQuantizationConfig,
    ComputeEnvironment,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    FP8RecipeKwargs,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    LoggerType,
    MegatronLMPlugin,
    MSAMPRecipeKwargs,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    SageMakerDistributedType,
    TorchDynamoPlugin,
    get_module_class_from_name,
    merge_fsdp_weights,
)
from accelerate_ref.utils import ao as ref_ao  # noqa: E402
from accelerate_ref.utils import dataclasses as ref_dataclasses  # noqa: E402
from accelerate_ref.utils._dataclasses import low_precision  # noqa: E402
from accelerate_ref.utils._dataclasses.megatron import ENV_DEFAULTS
from accelerate_ref.utils.fsdp_utils import require_fsdp_device, wrap_targets
from tests.optional import needs_torchao

# Members the utilities reference (v0.27) lists, by enum.
DOCUMENTED_MEMBERS = {
    ComputeEnvironment: ["LOCAL_MACHINE", "AMAZON_SAGEMAKER"],
    DistributedType: ["NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "DEEPSPEED", "TPU"],
    DynamoBackend: [
        "NO", "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS",
        "OFI", "FX2TRT", "ONNXRT", "TENSORRT", "IPEX", "TVM",
    ],
    LoggerType: ["ALL", "TENSORBOARD", "WANDB", "COMETML", "DVCLIVE"],
    PrecisionType: ["NO", "FP16", "BF16"],
    SageMakerDistributedType: ["NO", "DATA_PARALLEL", "MODEL_PARALLEL"],
}


@pytest.mark.parametrize("enum_class", list(DOCUMENTED_MEMBERS), ids=lambda cls: cls.__name__)
def test_documented_members_exist(enum_class):
    """enums.values: every documented member is there."""
    missing = [name for name in DOCUMENTED_MEMBERS[enum_class] if name not in enum_class.__members__]
    assert missing == []


ENUM_NAMES = [
    "ComputeEnvironment", "DistributedType", "DynamoBackend", "LoggerType",
    "PrecisionType", "RNGType", "SageMakerDistributedType",
]


@pytest.mark.parametrize("name", ENUM_NAMES)
def test_members_and_values_cover_hf(name):
    """enums.values: every member of HF accelerate's enum exists here with the same value and str()."""
    hf_utils = pytest.importorskip("accelerate.utils")
    ours, theirs = getattr(utils, name), getattr(hf_utils, name)
    for member in theirs:
        assert ours[member.name].value == member.value
        assert str(ours[member.name]) == str(member).replace(theirs.__name__, ours.__name__)
    assert issubclass(ours, str) == issubclass(theirs, str)


def test_distributed_type_values():
    """enums.values: str enum, values equal to names, JSON-serialisable; TPU means XLA."""
    assert DistributedType.MULTI_CPU == "MULTI_CPU"
    assert all(member.value == name for name, member in DistributedType.__members__.items() if name != "TPU")
    assert DistributedType.TPU is DistributedType.XLA
    with pytest.raises(ValueError, match="'TP' is not a valid DistributedType"):  # HF 1.15 has no TP member
        DistributedType("TP")
    assert json.dumps({"t": DistributedType.FSDP}) == '{"t": "FSDP"}'


def test_precision_values_and_errors():
    assert [str(member) for member in PrecisionType] == ["no", "fp8", "fp16", "bf16"]
    assert PrecisionType("bf16") is PrecisionType.BF16
    assert "fp16" in PrecisionType and "fp32" not in PrecisionType
    with pytest.raises(ValueError, match=r"^'fp32' is not a valid PrecisionType$"):  # Python's words, as HF's
        PrecisionType("fp32")


def test_base_enum_list_and_str():
    assert LoggerType.list()[:3] == ["all", "aim", "tensorboard"]
    assert str(LoggerType.COMETML) == "comet_ml"
    assert [str(member) for member in RNGType][:2] == ["torch", "cuda"]
    assert "generator" in RNGType


def test_ddp_kwargs_to_kwargs():
    """kwargs.ddp: only values that differ from the defaults are passed on."""
    assert DistributedDataParallelKwargs().to_kwargs() == {}
    kwargs = DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=50)
    assert kwargs.to_kwargs() == {"find_unused_parameters": True, "bucket_cap_mb": 50}
    assert DistributedDataParallelKwargs(bucket_cap_mb=0).bucket_cap_mb == 0  # unchecked, as HF's (DDP checks)


def test_autocast_kwargs():
    assert AutocastKwargs(cache_enabled=True).to_kwargs() == {"cache_enabled": True}
    assert AutocastKwargs(enabled=False).to_kwargs() == {"enabled": False}


def test_grad_scaler_kwargs_erratum():
    """autocast.fp16_scaler; erratum U: the doc's `backoff_filter` is `backoff_factor`."""
    assert GradScalerKwargs(backoff_factor=0.25).to_kwargs() == {"backoff_factor": 0.25}
    with pytest.raises(TypeError, match="backoff_filter"):
        GradScalerKwargs(backoff_filter=0.25)
    assert GradScalerKwargs(growth_factor=0.5).to_kwargs() == {"growth_factor": 0.5}  # unchecked, as HF's


def test_init_process_group_kwargs():
    """kwargs.init_process_group: the documented example and defaults (timeout by backend, as HF 1.15)."""
    default = InitProcessGroupKwargs()
    assert (default.backend, default.init_method, default.timeout) == ("nccl", None, timedelta(seconds=600))
    kwargs = InitProcessGroupKwargs(timeout=timedelta(seconds=800))
    assert kwargs.to_kwargs() == {"timeout": timedelta(seconds=800)}
    assert InitProcessGroupKwargs(backend="gloo").to_kwargs() == {"backend": "gloo", "timeout": timedelta(seconds=1800)}
    assert InitProcessGroupKwargs(timeout=800).timeout == 800  # kept unchecked, as HF's (torch checks it)


def test_gradient_accumulation_plugin():
    """accumulate.plugin: fields and defaults; num_steps kept as given (HF checks nothing here)."""
    plugin = GradientAccumulationPlugin(num_steps=2)
    assert (plugin.num_steps, plugin.adjust_scheduler, plugin.sync_with_dataloader, plugin.sync_each_batch) == (
        2, True, True, False,
    )
    assert plugin.to_kwargs() == {"num_steps": 2}
    assert GradientAccumulationPlugin(num_steps=0).num_steps == 0


def test_dataloader_configuration_defaults():
    config = DataLoaderConfiguration()
    assert (
        config.split_batches, config.dispatch_batches, config.even_batches, config.use_seedable_sampler,
        config.data_seed, config.non_blocking, config.use_stateful_dataloader,
    ) == (False, None, True, False, None, False, False)


def test_project_configuration(tmp_path):
    """save_state.auto_naming: logging_dir follows project_dir unless given."""
    config = ProjectConfiguration(project_dir=str(tmp_path))
    assert config.logging_dir == str(tmp_path)
    assert (config.automatic_checkpoint_naming, config.total_limit, config.iteration, config.save_on_each_node) == (
        False, None, 0, False,
    )
    explicit = ProjectConfiguration(project_dir="p", logging_dir="logs")
    explicit.set_directories("q")
    assert (explicit.project_dir, explicit.logging_dir) == ("q", "logs")
    assert ProjectConfiguration(total_limit=0).total_limit == 0  # unchecked, as HF's


def test_torch_dynamo_plugin(monkeypatch):
    """plugin.dynamo: backend normalised to DynamoBackend; unset fields from the launcher's environment."""
    for name in ("BACKEND", "MODE", "USE_FULLGRAPH", "USE_DYNAMIC"):
        monkeypatch.delenv(f"ACCELERATE_DYNAMO_{name}", raising=False)
    plugin = TorchDynamoPlugin()
    assert (plugin.backend, plugin.mode, plugin.fullgraph, plugin.dynamic) == (DynamoBackend.NO, "default", False, None)
    assert TorchDynamoPlugin(backend="inductor").backend is DynamoBackend.INDUCTOR
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", "true")
    from_env = TorchDynamoPlugin()
    assert (from_env.backend, from_env.dynamic) == (DynamoBackend.EAGER, True)
    assert from_env.to_kwargs() == {"backend": "eager", "dynamic": True}  # torch.compile's backend name, as HF
    with pytest.raises(ValueError, match="'NOPE' is not a valid DynamoBackend"):
        TorchDynamoPlugin(backend="nope")


def test_profile_kwargs_build(tmp_path):
    """profile.context: ProfileKwargs builds a torch profiler; unknown activities are named."""
    import torch

    assert ProfileKwargs(record_shapes=True).to_kwargs() == {"record_shapes": True}
    profiler = ProfileKwargs(activities=["cpu"], record_shapes=True).build()
    assert isinstance(profiler, torch.profiler.profile)
    with profiler:
        torch.ones(2) + 1
    assert profiler.key_averages() is not None
    with pytest.raises(ValueError, match="Invalid profiler activity: gpu"):
        ProfileKwargs(activities=["gpu"]).build()


@pytest.mark.parametrize("backend", ["nccl", "gloo", None])
@pytest.mark.parametrize("timeout", [None, timedelta(seconds=800)])
def test_init_process_group_kwargs_timeout_default_by_backend(backend, timeout) -> None:
    ref = ref_utils.InitProcessGroupKwargs(backend=backend, timeout=timeout)
    hf = hf_utils.InitProcessGroupKwargs(backend=backend, timeout=timeout)
    assert (ref.backend, ref.init_method, ref.timeout) == (hf.backend, hf.init_method, hf.timeout)


def test_enum_with_contains_tests_values() -> None:
    from accelerate.utils.dataclasses import EnumWithContains as HfMeta

    from accelerate_ref.utils.dataclasses import EnumWithContains as RefMeta

    answers = []
    for meta in (RefMeta, HfMeta):
        class Colour(enum.Enum, metaclass=meta):
            RED = "red"
            BLUE = "blue"

        answers.append(["red" in Colour, "green" in Colour, "BLUE" in Colour, "blue" in Colour])
    assert answers[0] == answers[1] == [True, False, False, True]


FP8_ENV = "ACCELERATE_FP8_"


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("name", ["CustomDtype", "FP8BackendType"])
def test_enums_as_hf(name):
    ref, hf = getattr(ref_dataclasses, name), getattr(hf_dataclasses, name)
    assert [(m.name, m.value) for m in ref] == [(m.name, m.value) for m in hf]
    assert issubclass(ref, str) is issubclass(hf, str)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("dtype", ["INT2", "INT4", "FP8"])
def test_custom_dtype_sizes_as_hf(dtype):
    ref_size = ref_utils.dtype_byte_size(getattr(ref_utils.CustomDtype, dtype))
    assert ref_size == hf_modeling.dtype_byte_size(getattr(hf_dataclasses.CustomDtype, dtype))


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("name", ["AORecipeKwargs", "TERecipeKwargs", "MSAMPRecipeKwargs", "FP8RecipeKwargs"])
def test_recipe_fields_as_hf(name):
    ref, hf = getattr(ref_dataclasses, name), getattr(hf_dataclasses, name)
    assert [(f.name, f.default) for f in dataclasses.fields(ref)] == [(f.name, f.default) for f in dataclasses.fields(hf)]
    parameters = [inspect.signature(c).parameters.values() for c in (ref, hf)]
    assert [[(p.name, p.kind, p.default) for p in each] for each in parameters][0] == [(p.name, p.kind, p.default) for p in parameters[1]]


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


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
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



@pytest.fixture
def with_transformer_engine(monkeypatch):
    """Both libraries believe TransformerEngine installed (the recipe is plain data; only this check needs TE)."""
    monkeypatch.setattr(low_precision, "is_transformer_engine_available", lambda: True)
    monkeypatch.setattr(hf_dataclasses, "is_transformer_engine_available", lambda: True)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize(("kwargs", "env"), TE_CASES)
@pytest.mark.parametrize("name", ["TERecipeKwargs", "FP8RecipeKwargs"])
def test_transformer_engine_recipes_as_hf(with_transformer_engine, monkeypatch, name, kwargs, env):
    for key, value in env.items():
        monkeypatch.setenv(FP8_ENV + key, value)
    _same(*_both(name, **kwargs))


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
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


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_unknown_fp8_backend_refused_before_transformer_engine_is_asked():
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="backend"):
        ref_utils.FP8RecipeKwargs(backend="nonsense")


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize(("kwargs", "env"), [({}, {}), ({}, {"OPT_LEVEL": "O1"}), ({"opt_level": "O3"}, {}), ({}, {"OPT_LEVEL": "o1"})])
def test_msamp_recipe_as_hf(monkeypatch, kwargs, env):
    for key, value in env.items():
        monkeypatch.setenv(FP8_ENV + key, value)
    _same(*_both("MSAMPRecipeKwargs", **kwargs))


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_ao_recipe_refused_without_torchao_as_hf(monkeypatch):
    monkeypatch.setattr(low_precision, "is_torchao_available", lambda: False)
    monkeypatch.setattr(hf_dataclasses, "is_torchao_available", lambda: False)
    assert _both("AORecipeKwargs") == [ImportError, ImportError]


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
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


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_torchao
def test_ao_recipe_keeps_a_given_config():
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig(emulate=True)
    ref, hf = _both("AORecipeKwargs", config=config, module_filter_func=ref_ao.filter_linear_layers)
    assert ref.config is config and ref.pad_inner_dim is None
    assert ref.to_dict().keys() == hf.to_dict().keys()


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


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
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


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("enable_msamp", [True, False])
def test_fp8_backend_from_deepspeed_plugin_as_hf(enable_msamp):
    plugin = SimpleNamespace(enable_msamp=enable_msamp)
    assert low_precision.fp8_backend_of({}, plugin).value == _hf_fp8_backend({}, plugin).value


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@needs_torchao
def test_fp8_backend_ao_recipe_as_hf():
    ref_handlers, hf_handlers = _recipes("AORecipeKwargs")
    assert low_precision.fp8_backend_of(ref_handlers).value == _hf_fp8_backend(hf_handlers).value == "AO"




#: Launcher-style settings, one of each parsed kind (int, flag, float, string).
ENVIRONMENT = {
    "MEGATRON_LM_TP_DEGREE": "2",
    "MEGATRON_LM_USE_DISTRIBUTED_OPTIMIZER": "true",
    "MEGATRON_LM_ATTENTION_BACKEND": "0",
    "MEGATRON_LM_HIDDEN_DROPOUT": "0.25",
    "MEGATRON_LM_RECOMPUTE_METHOD": "block",
    "MEGATRON_LM_DECODER_LAST_PIPELINE_NUM_LAYERS": "3",
}


def _fields(plugin: object) -> dict:
    return {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)}


def test_the_fields_are_hf_fields():
    assert [f.name for f in dataclasses.fields(MegatronLMPlugin)] == [
        f.name for f in dataclasses.fields(hf_utils.MegatronLMPlugin)
    ]


@pytest.mark.parametrize("environment", [{}, ENVIRONMENT], ids=["defaults", "from-environment"])
def test_unset_fields_take_hf_defaults_and_environment(monkeypatch, environment):
    for name in ENV_DEFAULTS:
        monkeypatch.delenv(f"MEGATRON_LM_{name.upper()}", raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    ours, theirs = _fields(MegatronLMPlugin()), _fields(hf_utils.MegatronLMPlugin())
    assert ours == theirs, {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs.get(k)}


def test_given_fields_win_and_consumed_samples_cover_three_splits():
    kwargs = {"tp_degree": 4, "sequence_parallelism": True, "consumed_samples": [8], "lr_decay_style": "cosine"}
    ours, theirs = MegatronLMPlugin(**kwargs), hf_utils.MegatronLMPlugin(**dict(kwargs, consumed_samples=[8]))
    assert _fields(ours) == _fields(theirs)
    assert ours.consumed_samples == [8, 0, 0]


@pytest.mark.usefixtures('fresh_accelerate_state')
@pytest.mark.parametrize(
    ("build", "error", "text"),
    [
        # a KeyError as HF's (torch's enum lookup), naming the field too (catalog plugin.unavailable_engines)
        (lambda: FullyShardedDataParallelPlugin(sharding_strategy="HALF"), KeyError, "sharding_strategy HALF"),
        (lambda: FullyShardedDataParallelPlugin(state_dict_type="LOCAL"), KeyError, "state_dict_type LOCAL"),
        (lambda: FullyShardedDataParallelPlugin(auto_wrap_policy="layer_wrap"), ValueError, "auto wrap policy: layer_wrap"),
        (lambda: FullyShardedDataParallelPlugin(mixed_precision_policy={"dtype": torch.float16}), ValueError, "mixed precision policy"),
        (lambda: BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True), ValueError, "load_in_8bit"),
        (lambda: BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="int4"), ValueError, "bnb_4bit_quant_type"),
        (lambda: FP8RecipeKwargs(backend="fp9"), ValueError, "backend"),
    ],
)
def test_bad_fields_are_named(build, error, text):
    with pytest.raises(error, match=text):
        build()


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_values_hf_leaves_unchecked_are_kept():
    """HF 1.15 checks none of these at construction (the engines do): neither does accelerate_ref."""
    assert MegatronLMPlugin(tp_degree=0).megatron_lm_default_args["tensor_model_parallel_size"] == 0
    assert DeepSpeedPlugin(zero_stage=4).deepspeed_config["zero_optimization"]["stage"] == 4
    assert DistributedDataParallelKwargs(comm_wrapper="power_sgd").comm_wrapper == "power_sgd"


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_fsdp_strategy_by_enum_number_and_name():
    from torch.distributed.fsdp import ShardingStrategy

    assert FullyShardedDataParallelPlugin(sharding_strategy=ShardingStrategy.NO_SHARD).sharding_strategy is ShardingStrategy.NO_SHARD
    assert FullyShardedDataParallelPlugin(sharding_strategy="4").sharding_strategy is ShardingStrategy.HYBRID_SHARD
    assert FullyShardedDataParallelPlugin(sharding_strategy="shard_grad_op").sharding_strategy is ShardingStrategy.SHARD_GRAD_OP


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_deepspeed_auto_filled_and_contradictions_named(tmp_path):
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": "auto"}}
    plugin = DeepSpeedPlugin(hf_ds_config=config, zero_stage=3, gradient_accumulation_steps=2)
    assert (plugin.get_value("zero_optimization.stage"), plugin.zero3_init_flag) == (3, True)
    plugin.deepspeed_config_process(train_micro_batch_size_per_gpu=4)
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 4
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu"):
        plugin.deepspeed_config_process(train_micro_batch_size_per_gpu=8)
    with pytest.raises(ValueError, match="zero_optimization.stage"):
        DeepSpeedPlugin(hf_ds_config={**config, "zero_optimization": {"stage": 1}}, zero_stage=2)
    broken = tmp_path / "ds.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="Expecting property name"):  # json's error escapes, as in HF
        DeepSpeedPlugin(hf_ds_config=str(broken))
    assert DeepSpeedPlugin().deepspeed_config["train_batch_size"] == "auto"


class _Layer(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(width, width)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Layer(8), _Layer(2)])
        self.head = torch.nn.Linear(8, 1)


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_wrap_targets_by_class_size_and_callable():
    model = _Model()
    assert get_module_class_from_name(model, "_Layer") is _Layer
    by_class = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="_Layer")
    assert wrap_targets(model, by_class) == ["layers.0", "layers.1"]
    by_size = FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=50)
    assert wrap_targets(model, by_size) == ["layers.0.inner"]
    head_only = FullyShardedDataParallelPlugin(auto_wrap_policy=lambda module, recurse, nonwrapped_numel: recurse or module is model.head)
    assert wrap_targets(model, head_only) == ["head"]  # FSDP1's policy signature
    with pytest.raises(ValueError, match="Missing"):
        wrap_targets(model, FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Missing"]))


@pytest.mark.usefixtures('fresh_accelerate_state')
@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"megatron_lm_plugin": MegatronLMPlugin()}, ("Megatron is not installed",)),  # HF 1.15's words
        pytest.param(
            {"deepspeed_plugin": DeepSpeedPlugin()},
            ("DeepSpeed is not installed", "pip install deepspeed"),
            marks=pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed: driven, not refused"),
        ),
        pytest.param(
            {"mixed_precision": "fp8"},
            ("fp8", "transformer_engine"),
            marks=pytest.mark.skipif(accelerate_ref.utils.is_fp8_available(), reason="an FP8 engine is installed: not driven"),
        ),
        ({"mixed_precision": "fp8", "kwargs_handlers": [MSAMPRecipeKwargs()]}, ("fp8", "msamp")),
        ({"fsdp_plugin": FullyShardedDataParallelPlugin(), "megatron_lm_plugin": MegatronLMPlugin()}, ("fsdp_plugin", "megatron_lm_plugin")),
        ({"fsdp_plugin": "FULL_SHARD"}, ("fsdp_plugin",)),
        ({"dynamo_backend": "eager", "dynamo_plugin": accelerate_ref.utils.TorchDynamoPlugin()}, ("dynamo_backend", "dynamo_plugin")),
        ({"parallelism_config": object()}, ("get_device_mesh",)),  # HF 1.15 builds its mesh first
        ({"even_batch": False}, ("even_batch",)),  # a misspelt keyword is not swallowed by the v0.27 ones
    ],
)
def test_accelerator_refuses_naming_argument_and_package(kwargs, names):
    with pytest.raises((ImportError, ValueError, TypeError, NotImplementedError, AttributeError)) as caught:
        accelerate_ref.Accelerator(**kwargs)
    for name in names:
        assert name in str(caught.value)


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_comm_hook_enum_and_kwargs_exclusion():
    handler = DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16, bucket_cap_mb=10)
    assert handler.comm_hook is DDPCommunicationHookType.FP16
    assert handler.to_kwargs() == {"bucket_cap_mb": 10}
    assert DistributedDataParallelKwargs(comm_hook="fp16").comm_hook == "fp16"  # kept as given, as HF's


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_merge_refuses_a_directory_without_metadata(tmp_path):
    with pytest.raises(ValueError, match="metadata"):
        merge_fsdp_weights(tmp_path, tmp_path / "out")


@pytest.mark.usefixtures('fresh_accelerate_state')
def test_fsdp_refuses_devices_torch_cannot_shard_on_by_name():
    require_fsdp_device("cpu")  # torch's fully_shard runs on the CPU over gloo
    with pytest.raises(NotImplementedError, match="XLA devices"):
        require_fsdp_device("xla")
    with pytest.raises(NotImplementedError, match=r"torch\.nosuchdevice\.Stream"):
        require_fsdp_device("nosuchdevice")
