"""Probes of ``accelerate.utils.dataclasses``: the enums, the kwargs handlers and the small configurations.

Each dataclass is built with its defaults, with valid values, from its
environment variables, and with every value its ``__post_init__`` refuses;
the plugins have their own modules (``utils_dataclasses_fsdp``,
``utils_dataclasses_deepspeed``, ``utils_dataclasses_megatron``,
``utils_dataclasses_engines``).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import torch

from ..probe import Api, probe

AREA = "utils.dataclasses"
ENUMS = ("DistributedType", "SageMakerDistributedType", "FP8BackendType", "ComputeEnvironment", "DynamoBackend",
         "LoggerType", "PrecisionType", "RNGType", "CustomDtype", "DDPCommunicationHookType")
#: One kwargs handler of each kind, built with a non-default value, for ``to_dict``/``to_kwargs``.
HANDLERS = {
    "AutocastKwargs": {"cache_enabled": True},
    "DistributedDataParallelKwargs": {"find_unused_parameters": True, "bucket_cap_mb": 50},
    "GradScalerKwargs": {"backoff_factor": 0.25},
    "InitProcessGroupKwargs": {"backend": "gloo"},
    "GradientAccumulationPlugin": {"num_steps": 2},
    "ProfileKwargs": {"activities": ["cpu"], "record_shapes": True},
    "TorchDynamoPlugin": {"backend": "inductor", "mode": "reduce-overhead"},
}


def _path(name: str) -> str:
    return f"{AREA}.{name}"


@probe(AREA)
def enum_members(api: Api) -> None:
    for name in ENUMS:
        enum_class = api.get(_path(name))
        api.observe(f"{name} members", lambda: [(member.name, member.value) for member in enum_class])
        api.observe(f"{name} names", lambda: sorted(enum_class.__members__))
        api.observe(f"{name} is str", issubclass, enum_class, str)
        first = next(iter(enum_class))
        api.observe(f"{name} str()", str, first)
        api.observe(f"{name} format", "{}".format, first)
        api.observe(f"{name} equals its value", lambda: first == first.value)
        api.observe(f"{name} by value", enum_class, first.value)
        api.observe(f"{name} unknown value", enum_class, "no-such-value")
        api.observe(f"{name} contains a value", lambda: first.value in enum_class)
        api.observe(f"{name} contains a stranger", lambda: "no-such-value" in enum_class)
    for name in ("DynamoBackend", "LoggerType", "PrecisionType", "RNGType", "DDPCommunicationHookType"):
        api.call(f"{name}.list", _path(f"{name}.list"))
    api.observe("DistributedType as JSON", json.dumps, {"t": api.get(_path("DistributedType")).FSDP})
    api.observe("PrecisionType lower-cased lookup", api.get(_path("PrecisionType")), "BF16")
    api.observe("DynamoBackend from a lower-case name", api.get(_path("DynamoBackend")), "inductor")


@probe(AREA)
def kwargs_handlers_to_dict_and_kwargs(api: Api) -> None:
    for name, values in HANDLERS.items():
        api.call(f"{name}()", _path(name))
        handler = api.call(f"{name}({values})", _path(name), **values)
        if handler is not None:
            api.observe(f"{name} to_dict", handler.to_dict)
            api.observe(f"{name} to_kwargs", handler.to_kwargs)
    api.observe("defaults to_kwargs", lambda: api.get(_path("AutocastKwargs"))().to_kwargs())
    api.call("an unknown field", _path("GradScalerKwargs"), backoff_filter=0.25)


@probe(AREA)
def kwargs_handler_to_kwargs_ignores_the_environment(api: Api) -> None:
    os.environ["ACCELERATE_DYNAMO_BACKEND"] = "EAGER"
    os.environ["ACCELERATE_DYNAMO_MODE"] = "max-autotune"
    plugin = api.call("from the environment", _path("TorchDynamoPlugin"))
    if plugin is not None:
        api.observe("to_kwargs", plugin.to_kwargs)
        api.observe("to_dict", plugin.to_dict)


@probe(AREA)
def unusual_kwargs_values(api: Api) -> None:
    """Values HF passes on unchecked (torch refuses them later, or never)."""
    api.call("DDP bucket_cap_mb 0", _path("DistributedDataParallelKwargs"), bucket_cap_mb=0)
    api.call("DDP comm_hook as a string", _path("DistributedDataParallelKwargs"), comm_hook="fp16")
    api.call("DDP comm_hook unknown", _path("DistributedDataParallelKwargs"), comm_hook="zip")
    api.call("DDP comm_wrapper POWER_SGD", _path("DistributedDataParallelKwargs"),
             comm_wrapper=api.get(_path("DDPCommunicationHookType")).POWER_SGD)
    api.call("GradScaler growth_factor 0.5", _path("GradScalerKwargs"), growth_factor=0.5)
    api.call("GradScaler backoff_factor 1.5", _path("GradScalerKwargs"), backoff_factor=1.5)
    api.call("GradScaler growth_interval 0", _path("GradScalerKwargs"), growth_interval=0)
    api.call("GradientAccumulation num_steps 0", _path("GradientAccumulationPlugin"), num_steps=0)
    api.call("GradientAccumulation num_steps 1.5", _path("GradientAccumulationPlugin"), num_steps=1.5)
    api.call("GradientAccumulation all fields", _path("GradientAccumulationPlugin"), num_steps=4,
             adjust_scheduler=False, sync_with_dataloader=False, sync_each_batch=True)


class _CommHookRecorder:
    """Stands in for a DDP model: records what ``register_comm_hook`` was given."""

    def __init__(self) -> None:
        self.registered: list = []

    def register_comm_hook(self, state, hook) -> None:
        self.registered.append({"state": state, "hook": getattr(hook, "__qualname__", hook)})


@probe(AREA)
def ddp_register_comm_hook(api: Api) -> None:
    hook_type = api.get(_path("DDPCommunicationHookType"))
    cases = {
        "no hook": {},
        "fp16": {"comm_hook": hook_type.FP16},
        "bf16": {"comm_hook": hook_type.BF16},
        "power_sgd": {"comm_hook": hook_type.POWER_SGD, "comm_state_option": {"matrix_approximation_rank": 2}},
        "batched_power_sgd": {"comm_hook": hook_type.BATCHED_POWER_SGD},
        "power_sgd wrapped in fp16": {"comm_hook": hook_type.POWER_SGD, "comm_wrapper": hook_type.FP16},
        "fp16 wrapped in bf16": {"comm_hook": hook_type.FP16, "comm_wrapper": hook_type.BF16},
        "a wrapper alone": {"comm_wrapper": hook_type.FP16},
        "fp16 given as a string": {"comm_hook": "fp16"},
        "unknown state option": {"comm_hook": hook_type.POWER_SGD, "comm_state_option": {"no_such_option": 1}},
    }
    for label, values in cases.items():
        model = _CommHookRecorder()
        kwargs = api.call(f"{label}: build", _path("DistributedDataParallelKwargs"), **values)
        if kwargs is not None:
            api.observe(f"{label}: register", kwargs.register_comm_hook, model)
            api.record(f"{label}: registered", model.registered)
    kwargs = api.get(_path("DistributedDataParallelKwargs"))(comm_hook=hook_type.FP16)
    api.observe("to_dict", kwargs.to_dict)
    api.observe("to_dict(ignore_keys=())", kwargs.to_dict, ignore_keys=())
    api.observe("to_dict(ignore_keys=('dim',))", kwargs.to_dict, ignore_keys=("dim",))
    api.observe("to_kwargs", kwargs.to_kwargs)


@probe(AREA)
def init_process_group_timeout_by_backend(api: Api) -> None:
    for backend in ("nccl", "gloo", "mpi", None):
        kwargs = api.call(f"backend {backend}", _path("InitProcessGroupKwargs"), backend=backend)
        if kwargs is not None:  # the harness describes a timedelta by its type alone
            api.record(f"backend {backend} timeout", str(kwargs.timeout))
            api.observe(f"backend {backend} to_kwargs", lambda: {key: str(value) for key, value
                                                                 in kwargs.to_kwargs().items()})
    for timeout in (timedelta(seconds=800), timedelta(seconds=-1), 800):
        kwargs = api.call(f"timeout {timeout!r}", _path("InitProcessGroupKwargs"), timeout=timeout)
        if kwargs is not None:
            api.record(f"timeout {timeout!r} kept", str(kwargs.timeout))


@probe(AREA)
def profile_kwargs_build(api: Api) -> None:
    build = lambda **values: api.get(_path("ProfileKwargs"))(**values).build()  # noqa: E731
    api.observe("defaults", build)
    api.observe("cpu activity", build, activities=["cpu"])
    api.observe("cpu and cuda", build, activities=["cpu", "cuda"])
    api.observe("an unknown activity", build, activities=["cpu", "tpu"])
    api.observe("an upper-case activity", build, activities=["CPU"])
    api.observe("xpu activity", build, activities=["xpu"])
    api.observe("hpu activity", build, activities=["hpu"])
    api.observe("a schedule", build, schedule_option={"wait": 1, "warmup": 1, "active": 2})
    api.observe("a bad schedule", build, schedule_option={"wait": 1, "no_such_key": 1})
    profile = api.get(_path("ProfileKwargs"))(activities=["cpu"], schedule_option={"wait": 0, "warmup": 0,
                                                                                   "active": 1})
    api.observe("profile fields", lambda: profile)
    api.observe("to_kwargs", profile.to_kwargs)


@probe(AREA)
def project_configuration(api: Api) -> None:
    config = api.call("defaults", _path("ProjectConfiguration"))
    api.call("project_dir only", _path("ProjectConfiguration"), project_dir="runs")
    api.call("both dirs", _path("ProjectConfiguration"), project_dir="runs", logging_dir="logs")
    api.call("every field", _path("ProjectConfiguration"), project_dir="runs", automatic_checkpoint_naming=True,
             total_limit=2, iteration=3, save_on_each_node=True)
    api.call("total_limit 0", _path("ProjectConfiguration"), total_limit=0)
    api.call("total_limit -1", _path("ProjectConfiguration"), total_limit=-1)
    api.call("iteration -1", _path("ProjectConfiguration"), iteration=-1)
    if config is not None:
        api.observe("set_directories", config.set_directories, "elsewhere")
        api.record("after set_directories", config)
        api.observe("set_directories(None)", config.set_directories)
        api.record("after set_directories(None)", config)
    config = api.get(_path("ProjectConfiguration"))(project_dir="a", logging_dir="b")
    api.observe("set_directories keeps a logging dir", config.set_directories, "c")
    api.record("after keeping", config)


@probe(AREA)
def dataloader_configuration_and_tensor_information(api: Api) -> None:
    api.call("DataLoaderConfiguration()", _path("DataLoaderConfiguration"))
    api.call("every field", _path("DataLoaderConfiguration"), split_batches=True, dispatch_batches=False,
             even_batches=False, use_seedable_sampler=True, data_seed=3, non_blocking=True,
             use_stateful_dataloader=True)
    api.call("an unknown field", _path("DataLoaderConfiguration"), split_batch=True)
    api.call("TensorInformation", _path("TensorInformation"), shape=torch.Size([2, 3]), dtype=torch.float16)
    api.call("TorchTensorParallelPlugin()", _path("TorchTensorParallelPlugin"))
    api.call("TorchTensorParallelPlugin(tp_size=2)", _path("TorchTensorParallelPlugin"), tp_size=2)


@probe(AREA)
def torch_dynamo_plugin(api: Api) -> None:
    plugin = api.get(_path("TorchDynamoPlugin"))
    api.call("defaults", _path("TorchDynamoPlugin"))
    api.call("a lower-case backend", _path("TorchDynamoPlugin"), backend="eager")
    api.call("a DynamoBackend", _path("TorchDynamoPlugin"), backend=api.get(_path("DynamoBackend")).AOT_EAGER)
    api.call("an unknown backend", _path("TorchDynamoPlugin"), backend="no-such-backend")
    api.call("a backend that is not a string", _path("TorchDynamoPlugin"), backend=3)
    api.call("every field", _path("TorchDynamoPlugin"), backend="inductor", mode="max-autotune", fullgraph=True,
             dynamic=False, options={"trace.enabled": False}, disable=True, use_regional_compilation=True)
    for key, value in (("BACKEND", "cudagraphs"), ("MODE", "reduce-overhead"), ("USE_FULLGRAPH", "yes"),
                       ("USE_DYNAMIC", "0"), ("USE_REGIONAL_COMPILATION", "true")):
        os.environ[f"ACCELERATE_DYNAMO_{key}"] = value
    from_env = api.call("from the environment", _path("TorchDynamoPlugin"))
    if from_env is not None:
        api.observe("from the environment: to_dict", from_env.to_dict)
        api.observe("from the environment: to_kwargs", from_env.to_kwargs)
    os.environ["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = "maybe"
    api.call("an unreadable flag", _path("TorchDynamoPlugin"))
    os.environ["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = "0"
    os.environ["ACCELERATE_DYNAMO_USE_DYNAMIC"] = "maybe"
    api.call("an unreadable dynamic flag", _path("TorchDynamoPlugin"))
    given = plugin(backend="eager", use_regional_compilation=True, dynamic=True)
    api.observe("given: to_kwargs (environment cleared)", given.to_kwargs)


@probe(AREA)
def parallelism_handlers(api: Api) -> None:
    api.call("TorchContextParallelConfig()", _path("TorchContextParallelConfig"))
    api.call("alltoall", _path("TorchContextParallelConfig"), cp_comm_strategy="alltoall")
    api.call("an unknown strategy", _path("TorchContextParallelConfig"), cp_comm_strategy="ring")
    os.environ["PARALLELISM_CONFIG_CP_COMM_STRATEGY"] = "alltoall"
    api.call("strategy from the environment", _path("TorchContextParallelConfig"))
    os.environ["PARALLELISM_CONFIG_CP_COMM_STRATEGY"] = "broadcast"
    api.call("unknown strategy from the environment", _path("TorchContextParallelConfig"))
    api.call("TorchTensorParallelConfig()", _path("TorchTensorParallelConfig"))
    api.call("async tp", _path("TorchTensorParallelConfig"), enable_async_tp=True)


@probe(AREA)
def deepspeed_sequence_parallel_config(api: Api) -> None:
    config = _path("DeepSpeedSequenceParallelConfig")
    api.call("defaults", config)
    api.call("a fixed length", config, sp_seq_length=128, sp_seq_length_is_variable=False)
    api.call("fixed without a length", config, sp_seq_length_is_variable=False)
    for implementation in ("sdpa", "flash_attention_2", "flash_attention_3", "kernels-community/flash-attn2",
                           "eager", "flex_attention", "my_attention", "org/other-kernel"):
        api.call(f"attention {implementation}", config, sp_attn_implementation=implementation)
    os.environ["PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE"] = "false"
    os.environ["PARALLELISM_CONFIG_SP_SEQ_LENGTH"] = "256"
    os.environ["PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"] = "sdpa"
    api.call("from the environment", config)
    os.environ["PARALLELISM_CONFIG_SP_SEQ_LENGTH"] = "None"
    api.call("length None from the environment", config)
    os.environ["PARALLELISM_CONFIG_SP_SEQ_LENGTH"] = "long"
    api.call("an unreadable length", config)
    os.environ["PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"] = "eager"
    api.call("eager from the environment", config, sp_seq_length=8)


@probe(AREA)
def get_module_class_from_name(api: Api) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.LayerNorm(2)))
    find = _path("get_module_class_from_name")
    for name in ("Sequential", "Linear", "LayerNorm", "ReLU", "Conv2d"):
        api.call(name, find, model, name)
    api.call("a leaf", find, torch.nn.ReLU(), "Linear")
    api.call("not a module", find, object(), "Linear")
