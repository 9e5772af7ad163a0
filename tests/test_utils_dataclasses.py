"""Catalog: enums.values, kwargs.ddp, kwargs.init_process_group, accumulate.plugin,
autocast.fp16_scaler, plugin.dynamo, save_state.auto_naming, profile.context."""

import json
from datetime import timedelta

import pytest

import accelerate_ref.utils as utils
from accelerate_ref.utils import (
    AutocastKwargs,
    ComputeEnvironment,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    LoggerType,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    SageMakerDistributedType,
    TorchDynamoPlugin,
)

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
