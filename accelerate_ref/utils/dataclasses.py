"""Enums, kwargs handlers, plugins and configurations passed to the Accelerator.

Catalog: enums.values, kwargs.ddp, kwargs.init_process_group, autocast.bf16,
autocast.fp16_scaler, accumulate.plugin, profile.context, plugin.dynamo,
save.once_per_machine, save_state.auto_naming, save_state.total_limit.

Kept free of torch at import time (`accelerate_ref.state` imports it early);
only `ProfileKwargs.build` imports torch, when called.
"""

from __future__ import annotations

import enum
import os
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional

from .constants import (  # noqa: F401  (HF's utils.dataclasses exposes them)
    BETA_CP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_PYTORCH_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
    MITA_PROFILING_AVAILABLE_PYTORCH_VERSION,
    XPU_PROFILING_AVAILABLE_PYTORCH_VERSION,
)
from .constants import (  # noqa: F401  (HF's utils.dataclasses exposes the FSDP option lists)
    FSDP2_PYTORCH_VERSION,
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
)
from .._lazy import lazy_exports
from ._dataclasses.base import KwargsHandler, check
from .environment import parse_flag_from_env, str_to_bool

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch


# --------------------------------------------------------------------------
# Enums
# --------------------------------------------------------------------------
class EnumWithContains(enum.EnumMeta):
    """Metaclass letting `value in SomeEnum` test values (not only members)."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum whose `str()` is its value, with a `list()` of all values.

    Rule: `"value" in SomeEnum` tests values; an unknown value is Python's
    ValueError (``'x' is not a valid SomeEnum``), as HF's. Catalog: enums.values.
    """

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """All values of the enum, as strings, in definition order."""
        return [str(member) for member in cls]


class DistributedType(str, enum.Enum):
    """The kind of distributed environment the processes run in.

    Rule: a str enum whose values are the member names (JSON-serialisable),
    as in HF accelerate. The documented `TPU` member is an alias of `XLA`
    (`DistributedType.TPU is DistributedType.XLA`), which is what the name
    means since accelerate 0.27.
    Catalog: enums.values, launch.distributed_type_branch.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    TPU = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


#: Distributed types of one process per accelerator (what HF calls multi-device; FSDP takes their place).
ACCELERATOR_WORLD_TYPES = (
    DistributedType.MULTI_GPU, DistributedType.MULTI_MLU, DistributedType.MULTI_SDAA, DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU, DistributedType.MULTI_XPU, DistributedType.MULTI_HPU, DistributedType.MULTI_NEURON,
)


class SageMakerDistributedType(str, enum.Enum):
    """Distributed mode on Amazon SageMaker: NO, DATA_PARALLEL, MODEL_PARALLEL.

    Catalog: enums.values.
    """

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class ComputeEnvironment(str, enum.Enum):
    """Where the job runs: LOCAL_MACHINE or AMAZON_SAGEMAKER.

    Catalog: enums.values.
    """

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class DynamoBackend(str, BaseEnum):
    """A `torch.compile` backend; NO means no compilation.

    Rule: values are the upper-case member names; `IPEX` is kept because the
    utilities reference documents it (HF 1.15 dropped it).
    Catalog: enums.values, plugin.dynamo.
    """

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class LoggerType(BaseEnum):
    """A supported experiment tracker; `ALL` means every installed one.

    Rule: values are the lower-case tracker names ("tensorboard", "wandb",
    "comet_ml", "dvclive", ...).
    Catalog: enums.values, tracking.init_log_end.
    """

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class PrecisionType(str, BaseEnum):
    """Floating-point precision: "no" (fp32), "fp8", "fp16", "bf16".

    Rule: an unknown string, e.g. `PrecisionType("fp32")`, is a ValueError.
    Catalog: enums.values, autocast.bf16, autocast.fp16_scaler.
    """

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class DDPCommunicationHookType(BaseEnum):
    """Torch DDP communication hooks `DistributedDataParallelKwargs.comm_hook` can register.

    Values: NO, FP16, BF16 (compress gradients for the all-reduce), POWER_SGD,
    BATCHED_POWER_SGD (low-rank compression). Catalog: plugin.ddp_comm_hook.
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class RNGType(BaseEnum):
    """A random number generator that can be synchronised across processes.

    Catalog: enums.values, data.shuffle_sync.
    """

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


@dataclass
class TensorInformation:
    """The shape and dtype of a tensor, enough to allocate one like it.

    Catalog: ops.recursively_apply (see `get_data_structure`, `initialize_tensors`).
    """

    shape: torch.Size
    dtype: torch.dtype


# --------------------------------------------------------------------------
# Kwargs handlers
# --------------------------------------------------------------------------
@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments for `torch.autocast` (`enabled`, `cache_enabled`).

    Catalog: autocast.bf16.
    """

    enabled: bool = True
    cache_enabled: Optional[bool] = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for `torch.nn.parallel.DistributedDataParallel`.

    Rule (HF 1.15's): the documented fields, passed on unchecked (torch's
    DDP checks them); `comm_hook`/`comm_wrapper` are used as given, so only a
    `DDPCommunicationHookType` member registers a hook (a plain string such
    as "fp16" matches none and registers nothing, as in HF).
    Catalog: kwargs.ddp.
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def to_dict(self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")) -> dict[str, Any]:
        """Every field but ``ignore_keys`` (deep-copied).

        Rule (HF's): by default the comm hook fields are left out, so
        `to_kwargs` gives the DDP constructor's arguments only (the hook is
        registered after wrapping, `register_comm_hook`); ``ignore_keys=()``
        gives every field. Catalog: kwargs.ddp, plugin.ddp_comm_hook.
        """
        return {key: value for key, value in super().to_dict().items() if key not in ignore_keys}

    def register_comm_hook(self, model: Any) -> None:
        """Register torch's DDP communication hook named by `comm_hook` on the DDP ``model``.

        Rule: FP16/BF16 are torch's compress hooks, POWER_SGD/BATCHED_POWER_SGD
        its PowerSGD hooks with a `PowerSGDState` built from
        `comm_state_option`; `comm_wrapper` (FP16/BF16) wraps the hook; NO
        registers nothing. Catalog: plugin.ddp_comm_hook.
        """
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        kind = DDPCommunicationHookType
        hooks = {
            kind.FP16: default_hooks.fp16_compress_hook,
            kind.BF16: default_hooks.bf16_compress_hook,
            kind.POWER_SGD: powerSGD_hook.powerSGD_hook,
            kind.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers = {kind.FP16: default_hooks.fp16_compress_wrapper, kind.BF16: default_hooks.bf16_compress_wrapper}
        hook = hooks.get(self.comm_hook)
        if hook is None:
            return
        if self.comm_wrapper in wrappers:
            hook = wrappers[self.comm_wrapper](hook)
        power_sgd = self.comm_hook in (kind.POWER_SGD, kind.BATCHED_POWER_SGD)
        state = powerSGD_hook.PowerSGDState(None, **self.comm_state_option) if power_sgd else None
        model.register_comm_hook(state=state, hook=hook)


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for the gradient scaler used with fp16.

    Rule: the documented fields of `torch.amp.GradScaler`. Erratum: the
    utilities reference's example writes `backoff_filter=0.25`; the field is
    `backoff_factor` (the misspelling is a TypeError). Values are passed on
    unchecked, as HF's (the scaler checks them).
    Catalog: autocast.fp16_scaler.
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for `torch.distributed.init_process_group`.

    Rule: `backend`, `init_method` and `timeout` (a `datetime.timedelta`);
    a timeout left None becomes HF 1.15's default for the backend (600 s for
    "nccl", 1800 s for any other, None included); a given timeout is kept
    unchecked, as HF's (torch checks it at init).
    Catalog: kwargs.init_process_group.
    """

    backend: Optional[str] = "nccl"
    init_method: Optional[str] = None
    timeout: Optional[timedelta] = None

    def __post_init__(self) -> None:
        if self.timeout is None:
            self.timeout = timedelta(seconds=600 if self.backend == "nccl" else 1800)


@dataclass
class ProfileKwargs(KwargsHandler):
    """Arguments for `torch.profiler.profile`, used by `Accelerator.profile()`.

    Rule: `activities` are names ("cpu", "cuda", "xpu"); `schedule_option` is
    passed to `torch.profiler.schedule`; when `output_trace_dir` is set the
    Accelerator writes a Chrome trace there.
    Catalog: profile.context.
    """

    activities: Optional[list[str]] = None
    schedule_option: Optional[dict[str, int]] = None
    on_trace_ready: Optional[Callable[..., Any]] = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: Optional[str] = None

    def build(self) -> torch.profiler.profile:
        """Build the torch profiler these arguments describe.

        Rule (HF 1.15's): activity names are "cpu" and "cuda", plus "hpu",
        "xpu" and "mtia" where that device is available; any other name is a
        ValueError naming the first unknown one and the available names.
        Catalog: profile.context.
        """
        import torch.profiler

        activities = None
        if self.activities is not None:
            available = _profiler_activities()
            for name in self.activities:
                check(name in available, f"Invalid profiler activity: {name}. Must be one of {list(available)}.")
            activities = [available[name] for name in self.activities]
        schedule = None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


def _profiler_activities() -> dict[str, Any]:
    """Profiler activity name -> torch's ``ProfilerActivity``, for the devices available here (HF's table)."""
    import torch.profiler

    from .imports import is_hpu_available
    from .versions import is_torch_version

    activity = torch.profiler.ProfilerActivity
    available = {"cpu": activity.CPU, "cuda": activity.CUDA}
    if is_hpu_available():
        available["hpu"] = activity.HPU
    if is_torch_version(">=", XPU_PROFILING_AVAILABLE_PYTORCH_VERSION) and torch.xpu.is_available():
        available["xpu"] = activity.XPU
    if is_torch_version(">=", MITA_PROFILING_AVAILABLE_PYTORCH_VERSION) and torch.mtia.is_available():
        available["mtia"] = activity.MTIA
    return available


# --------------------------------------------------------------------------
# Plugins and configurations
# --------------------------------------------------------------------------
@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves.

    Rule: `num_steps` steps per optimizer update (unchecked here, as HF's);
    `adjust_scheduler` steps a prepared scheduler only on real updates;
    `sync_with_dataloader` forces a sync on the loader's last batch;
    `sync_each_batch` syncs gradients on every batch.
    Catalog: accumulate.plugin, accumulate.end_of_dataloader, accumulate.scheduler.
    """

    num_steps: Optional[int] = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


@dataclass
class DataLoaderConfiguration:
    """How `Accelerator.prepare` wraps data loaders.

    Rule: `split_batches` splits each batch across ranks instead of giving
    each rank its own; `dispatch_batches` lets rank 0 read and dispatch
    (None: only for IterableDataset); `even_batches` pads by duplicating the
    first samples; `use_seedable_sampler` makes shuffling reproducible with
    `set_seed` (`data_seed` overrides the seed); `non_blocking` is the host
    to device copy mode; `use_stateful_dataloader` uses torchdata's
    StatefulDataLoader.
    Catalog: data.split_batches, data.even_batches, data.uneven_batches,
    data.dispatch_batches, data.seedable_sampler.
    """

    split_batches: bool = False
    dispatch_batches: Optional[bool] = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: Optional[int] = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    """Where and how the Accelerator saves checkpoints and logs.

    Rule: `logging_dir` defaults to `project_dir`; with
    `automatic_checkpoint_naming` saves go to
    `project_dir/checkpoints/checkpoint_<iteration>`; `total_limit` keeps only
    that many newest checkpoints (values unchecked, as HF's); `save_on_each_node`
    saves once per machine instead of once overall.
    Catalog: save.once_per_machine, save_state.auto_naming, save_state.total_limit.
    """

    project_dir: Optional[str] = None
    logging_dir: Optional[str] = None
    automatic_checkpoint_naming: bool = False
    total_limit: Optional[int] = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: Optional[str] = None) -> None:
        """Set `project_dir`, and `logging_dir` to it when no logging dir was given.

        Catalog: save_state.auto_naming.
        """
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        self.set_directories(self.project_dir)


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """Arguments for `torch.compile` of the prepared model.

    Rule: unset fields come from the launcher's environment
    (ACCELERATE_DYNAMO_BACKEND, _MODE, _USE_FULLGRAPH, _USE_DYNAMIC,
    _USE_REGIONAL_COMPILATION), else backend "NO" and mode "default";
    `backend` (a string) is converted to `DynamoBackend` case-insensitively, an
    unknown name being a ValueError. ``use_regional_compilation`` makes `prepare`
    compile each block of a repeated ``ModuleList`` (and the rest of the
    model piece by piece) with `utils.other.compile_regions` instead of the
    whole model; it is not a `torch.compile` argument, so `to_kwargs` leaves
    it out. Catalog: plugin.dynamo.
    """

    backend: Optional[DynamoBackend] = None
    mode: Optional[str] = None
    fullgraph: Optional[bool] = None
    dynamic: Optional[bool] = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: Optional[bool] = None

    def __post_init__(self) -> None:
        prefix = "ACCELERATE_DYNAMO_"
        if self.backend is None:
            self.backend = os.environ.get(prefix + "BACKEND", "no")
        self.backend = DynamoBackend(self.backend.upper())
        if self.mode is None:
            self.mode = os.environ.get(prefix + "MODE", "default")
        if self.fullgraph is None:
            self.fullgraph = parse_flag_from_env(prefix + "USE_FULLGRAPH")
        if self.use_regional_compilation is None:
            self.use_regional_compilation = parse_flag_from_env(prefix + "USE_REGIONAL_COMPILATION")
        if self.dynamic is None and prefix + "USE_DYNAMIC" in os.environ:
            self.dynamic = str_to_bool(os.environ[prefix + "USE_DYNAMIC"]) == 1

    def to_dict(self) -> dict[str, Any]:
        """Every field, with `backend` as torch.compile's lower-case backend name."""
        fields = super().to_dict()
        fields["backend"] = self.backend.value.lower()
        return fields

    def to_kwargs(self) -> dict[str, Any]:
        """`torch.compile`'s arguments: the non-default fields but ``use_regional_compilation``."""
        kwargs = super().to_kwargs()
        kwargs.pop("use_regional_compilation", None)
        return kwargs


@dataclass
class TorchTensorParallelPlugin:
    """``Accelerator(torch_tp_plugin=...)``: the tensor parallel degree (HF 1.15 deprecates it for ParallelismConfig).

    Fields (HF's): ``tp_size`` (default 1) and ``torch_device_mesh`` (a
    ``torch.distributed.DeviceMesh`` or None, which HF 1.15 does not read).
    Rule: the Accelerator warns (FutureWarning) as HF does; ``tp_size`` 1 is
    no tensor parallelism and trains as without the plugin; a larger
    ``tp_size`` is refused (NotImplementedError): HF shards such models
    through ``ParallelismConfig`` and Transformers' ``tp_plan``, which
    accelerate_ref does not provide. Catalog: plugin.unavailable_engines.
    """

    tp_size: int = 1
    torch_device_mesh: Optional["torch.distributed.DeviceMesh"] = None


# --------------------------------------------------------------------------
# Tensor- and context-parallel handlers of a `ParallelismConfig`
# --------------------------------------------------------------------------
@dataclass
class TorchTensorParallelConfig:
    """The tensor-parallel handler of a `ParallelismConfig` (torch's tensor-parallel API).

    Rules (HF 1.15): needs torch >= BETA_TP_AVAILABLE_PYTORCH_VERSION and
    transformers >= BETA_TP_AVAILABLE_TRANSFORMERS_VERSION (ValueError naming
    the version; transformers not installed: ImportError, as HF's metadata
    lookup raises); ``enable_async_tp=True`` only warns that it is ignored.
    """

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        from .imports import is_transformers_available
        from .versions import compare_versions, is_torch_version

        if not is_torch_version(">=", BETA_TP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"Torch tensor parallelism needs PyTorch >= {BETA_TP_AVAILABLE_PYTORCH_VERSION}")
        if not is_transformers_available():
            raise ImportError(f"TP requires transformers >= {BETA_TP_AVAILABLE_TRANSFORMERS_VERSION}, which is not installed")
        if not compare_versions("transformers", ">=", BETA_TP_AVAILABLE_TRANSFORMERS_VERSION):
            raise ValueError(f"TP requires transformers >= {BETA_TP_AVAILABLE_TRANSFORMERS_VERSION}")
        if self.enable_async_tp:
            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.")


@dataclass
class TorchContextParallelConfig:
    """The context-parallel handler of a `ParallelismConfig` (torch's ``context_parallel``).

    Rules (HF 1.15): needs torch >= BETA_CP_AVAILABLE_PYTORCH_VERSION
    (ValueError); ``cp_comm_strategy`` defaults to
    PARALLELISM_CONFIG_CP_COMM_STRATEGY, else "allgather", and must be
    "allgather" or "alltoall" (ValueError naming it).
    """

    cp_comm_strategy: Optional[str] = field(
        default=None,
        metadata={"help": "How context-parallel ranks exchange keys and values: 'allgather' (default) or 'alltoall'."},
    )

    def __post_init__(self) -> None:
        from .versions import is_torch_version

        if not is_torch_version(">=", BETA_CP_AVAILABLE_PYTORCH_VERSION):
            raise ValueError(f"FSDP2-based context parallelism needs PyTorch >= {BETA_CP_AVAILABLE_PYTORCH_VERSION}")
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'.")

# The engine plugins, low-precision types and FP8 recipes, and Megatron-LM's plugin and model-config
# parsers live in `_dataclasses`, whose modules need nothing from this one; HF users import them from
# here, so they load on first use (PEP 562).
_PIECES = {
    ".bnb": ("BnbQuantizationConfig",),
    ".deepspeed": ("DeepSpeedPlugin", "DeepSpeedSequenceParallelConfig"),
    ".fsdp": ("FullyShardedDataParallelPlugin", "get_module_class_from_name"),
    ".low_precision": ("AORecipeKwargs", "CustomDtype", "FP8BackendType", "FP8RecipeKwargs", "MSAMPRecipeKwargs",
                       "TERecipeKwargs"),
    ".megatron": ("MegatronLMPlugin", "MODEL_CONFIGS_TO_MEGATRON_PARSERS", "add_model_config_to_megatron_parser",
                  "parse_bert_config", "parse_glm4_moe_config", "parse_gpt2_config", "parse_llama_config",
                  "parse_t5_config"),
}
__getattr__, __dir__ = lazy_exports(
    __name__, globals(), {name: (f"._dataclasses{module}", name) for module, names in _PIECES.items() for name in names}
)
