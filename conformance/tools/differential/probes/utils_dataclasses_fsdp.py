"""Probes of ``accelerate.utils.dataclasses.FullyShardedDataParallelPlugin``: defaults, ``FSDP_*`` environment,
FSDP1 and FSDP2 normal forms, every refusal and warning of ``__post_init__`` and of its ``set_*``/``validate_*``
methods."""

from __future__ import annotations

import os

import torch

from ..probe import Api, probe

AREA = "utils.dataclasses"
PLUGIN = "utils.dataclasses.FullyShardedDataParallelPlugin"


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)


class _Model(torch.nn.Module):
    _no_split_modules = ["_Block"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.head = torch.nn.Linear(2, 1)


def _build(api: Api, label: str, **values) -> object:
    """Build the plugin under ``label`` and record what ``dataclasses.fields`` leaves out of its description."""
    plugin = api.call(label, PLUGIN, **values)
    if plugin is not None and callable(plugin.param_init_fn):
        api.observe(f"{label}: param_init_fn", lambda: plugin.param_init_fn.__qualname__)
    return plugin


@probe(AREA)
def fsdp_plugin_defaults(api: Api) -> None:
    _build(api, "FSDP1 defaults")
    _build(api, "FSDP2 defaults", fsdp_version=2)
    _build(api, "fsdp_version 3", fsdp_version=3)
    _build(api, "fsdp_version as a string", fsdp_version="2")


@probe(AREA)
def fsdp_plugin_from_the_environment(api: Api) -> None:
    os.environ.update({
        "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "FSDP_OFFLOAD_PARAMS": "true", "FSDP_BACKWARD_PREFETCH": "BACKWARD_POST",
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "_Block,Linear", "FSDP_USE_ORIG_PARAMS": "1", "FSDP_FORWARD_PREFETCH": "yes",
        "FSDP_ACTIVATION_CHECKPOINTING": "true", "FSDP_IGNORED_MODULES": "head", "FSDP_MIN_NUM_PARAMS": "7",
    })
    _build(api, "FSDP1 from the environment")
    os.environ.update({"FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_FORWARD_PREFETCH": "no",
                       "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true", "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"})
    del os.environ["FSDP_FORWARD_PREFETCH"]
    _build(api, "FSDP2 from the environment")
    os.environ["FSDP_RESHARD_AFTER_FORWARD"] = "sometimes"
    _build(api, "an unreadable reshard flag")
    os.environ["FSDP_RESHARD_AFTER_FORWARD"] = "true"
    os.environ["FSDP_STATE_DICT_TYPE"] = "3"
    _build(api, "a state dict type by number")
    os.environ["FSDP_VERSION"] = "two"
    _build(api, "an unreadable version")


@probe(AREA)
def fsdp_plugin_sharding_strategy(api: Api) -> None:
    from torch.distributed.fsdp import ShardingStrategy

    for value in ("SHARD_GRAD_OP", "shard_grad_op", "HYBRID_SHARD_ZERO2", 3, "4", ShardingStrategy.NO_SHARD,
                  "bogus", 9, "9", 2.0):
        _build(api, f"FSDP1 sharding_strategy {value!r}", sharding_strategy=value)
    _build(api, "FSDP2 with a sharding_strategy", fsdp_version=2, sharding_strategy="FULL_SHARD")
    _build(api, "FSDP2 with both", fsdp_version=2, sharding_strategy="FULL_SHARD", reshard_after_forward=True)


@probe(AREA)
def fsdp_plugin_reshard_after_forward(api: Api) -> None:
    from torch.distributed.fsdp import ShardingStrategy

    for value in ("FULL_SHARD", "no_shard", 2, "5", ShardingStrategy.HYBRID_SHARD, True, "bogus", 7):
        _build(api, f"FSDP1 reshard_after_forward {value!r}", reshard_after_forward=value)
    for value in (True, False, "false", "Yes", "FULL_SHARD", 1, ShardingStrategy.FULL_SHARD):
        _build(api, f"FSDP2 reshard_after_forward {value!r}", fsdp_version=2, reshard_after_forward=value)


@probe(AREA)
def fsdp_plugin_prefetch_offload_and_flags(api: Api) -> None:
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, CPUOffloadPolicy

    for value in ("BACKWARD_PRE", "backward_post", "NO_PREFETCH", 1, "2", BackwardPrefetch.BACKWARD_POST, "bogus", 5):
        _build(api, f"FSDP1 backward_prefetch {value!r}", backward_prefetch=value)
    _build(api, "FSDP2 backward_prefetch", fsdp_version=2, backward_prefetch="BACKWARD_PRE")
    for version in (1, 2):
        _build(api, f"FSDP{version} cpu_offload True", fsdp_version=version, cpu_offload=True)
        _build(api, f"FSDP{version} cpu_offload 'yes'", fsdp_version=version, cpu_offload="yes")
    _build(api, "FSDP1 cpu_offload CPUOffload", cpu_offload=CPUOffload(offload_params=True))
    _build(api, "FSDP2 cpu_offload CPUOffload", fsdp_version=2, cpu_offload=CPUOffload(offload_params=True))
    _build(api, "FSDP1 cpu_offload CPUOffloadPolicy", cpu_offload=CPUOffloadPolicy())
    _build(api, "FSDP2 use_orig_params", fsdp_version=2, use_orig_params=True)
    _build(api, "FSDP2 sync_module_states False", fsdp_version=2, sync_module_states=False)
    _build(api, "FSDP2 three obsolete options", fsdp_version=2, use_orig_params=False, backward_prefetch="BACKWARD_PRE")
    _build(api, "FSDP2 forward_prefetch", fsdp_version=2, forward_prefetch=False)
    _build(api, "FSDP1 forward_prefetch", forward_prefetch=True)
    _build(api, "offload without checkpointing", fsdp_version=2, activation_checkpointing_offload=True)
    _build(api, "FSDP1 checkpointing offload", activation_checkpointing=True, activation_checkpointing_offload=True)
    _build(api, "FSDP2 checkpointing offload", fsdp_version=2, activation_checkpointing=True,
           activation_checkpointing_offload=True)
    _build(api, "ignored_modules", ignored_modules=[torch.nn.Linear(1, 1)])
    _build(api, "limit_all_gathers False", limit_all_gathers=False)


@probe(AREA, families=("cpu", "cuda"))
def fsdp_plugin_sync_module_states(api: Api) -> None:
    """HF materialises meta modules on the current accelerator, and refuses where there is none."""
    _build(api, "FSDP1 sync_module_states", sync_module_states=True)
    before = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")
    _build(api, "FSDP1 cpu_ram_efficient_loading", cpu_ram_efficient_loading=True)
    api.record("FSDP_CPU_RAM_EFFICIENT_LOADING set", (before, os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING")))
    _build(api, "FSDP1 cpu_ram_efficient_loading False", cpu_ram_efficient_loading=False)
    api.record("FSDP_CPU_RAM_EFFICIENT_LOADING after False", os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING"))
    _build(api, "FSDP2 cpu_ram_efficient_loading", fsdp_version=2, cpu_ram_efficient_loading=True)


@probe(AREA)
def fsdp_plugin_state_dict_type(api: Api) -> None:
    from torch.distributed.fsdp import StateDictType

    for value in ("SHARDED_STATE_DICT", "local_state_dict", 1, "2", StateDictType.FULL_STATE_DICT, "bogus", 8):
        _build(api, f"FSDP1 state_dict_type {value!r}", state_dict_type=value)
    _build(api, "FSDP2 LOCAL_STATE_DICT", fsdp_version=2, state_dict_type="LOCAL_STATE_DICT")
    _build(api, "FSDP2 FULL_STATE_DICT", fsdp_version=2, state_dict_type="FULL_STATE_DICT")
    plugin = api.get(PLUGIN)(state_dict_type="SHARDED_STATE_DICT")
    api.observe("set_state_dict_type(FULL) keeps the sharded configs", plugin.set_state_dict_type, "FULL_STATE_DICT")
    api.record("after set_state_dict_type", plugin)
    api.observe("set_state_dict_type()", plugin.set_state_dict_type)
    api.observe("set_state_dict_type(bogus)", plugin.set_state_dict_type, "bogus")
    plugin = api.get(PLUGIN)(fsdp_version=2)
    api.observe("FSDP2 set_state_dict_type(LOCAL)", plugin.set_state_dict_type, "LOCAL_STATE_DICT")
    api.record("FSDP2 after the refusal", plugin.state_dict_type)


@probe(AREA)
def fsdp_plugin_auto_wrap_policy(api: Api) -> None:
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    _build(api, "transformer_based_wrap", auto_wrap_policy="transformer_based_wrap",
           transformer_cls_names_to_wrap="_Block,Linear")
    _build(api, "TRANSFORMER_BASED_WRAP with a list", auto_wrap_policy="TRANSFORMER_BASED_WRAP",
           transformer_cls_names_to_wrap=["_Block"])
    _build(api, "size_based_wrap", auto_wrap_policy="size_based_wrap", min_num_params=100)
    _build(api, "size_based_wrap with a string size", auto_wrap_policy="size_based_wrap", min_num_params="100")
    _build(api, "no_wrap", auto_wrap_policy="no_wrap")
    _build(api, "an unknown policy", auto_wrap_policy="layer_wrap")
    _build(api, "a callable policy", auto_wrap_policy=size_based_auto_wrap_policy)
    _build(api, "a policy that is neither", auto_wrap_policy=5)
    for label, values in {
        "transformer classes by name": {"auto_wrap_policy": "transformer_based_wrap",
                                        "transformer_cls_names_to_wrap": ["_Block"]},
        "transformer classes from _no_split_modules": {"auto_wrap_policy": "transformer_based_wrap"},
        "an absent transformer class": {"auto_wrap_policy": "transformer_based_wrap",
                                        "transformer_cls_names_to_wrap": ["Missing"]},
        "size 100": {"auto_wrap_policy": "size_based_wrap", "min_num_params": 100},
        "size 0": {"auto_wrap_policy": "size_based_wrap"},
        "no policy": {},
    }.items():
        plugin = api.get(PLUGIN)(**values)
        api.observe(f"set_auto_wrap_policy: {label}", plugin.set_auto_wrap_policy, _Model())
        api.observe(f"set_auto_wrap_policy: {label}: policy", _describe_policy, plugin.auto_wrap_policy)
        api.record(f"set_auto_wrap_policy: {label}: class names", plugin.transformer_cls_names_to_wrap)


def _describe_policy(policy: object) -> object:
    if policy is None or not hasattr(policy, "keywords"):
        return policy
    return {"function": policy.func.__qualname__,
            "keywords": {key: sorted(c.__name__ for c in value) if isinstance(value, set) else value
                         for key, value in policy.keywords.items()}}


@probe(AREA)
def fsdp_plugin_mixed_precision(api: Api) -> None:
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    for version in (1, 2):
        for value in ("fp16", "bf16", "fp8", "fp32", "fp64"):
            _build(api, f"FSDP{version} policy {value!r}", fsdp_version=version, mixed_precision_policy=value)
    full = {"param_dtype": torch.float16, "reduce_dtype": torch.float16, "buffer_dtype": torch.float32}
    _build(api, "FSDP1 a dict policy", mixed_precision_policy=full)
    _build(api, "FSDP1 a dict without buffer_dtype", mixed_precision_policy={"param_dtype": torch.float16,
                                                                             "reduce_dtype": torch.float16})
    _build(api, "FSDP1 a dict with a float64", mixed_precision_policy=dict(full, param_dtype=torch.float64))
    _build(api, "FSDP2 a dict policy", fsdp_version=2, mixed_precision_policy={
        "param_dtype": torch.bfloat16, "reduce_dtype": torch.float32, "output_dtype": torch.bfloat16})
    _build(api, "FSDP2 a FSDP1 dict", fsdp_version=2, mixed_precision_policy=full)
    _build(api, "FSDP1 a dtype", mixed_precision_policy=torch.float16)
    _build(api, "FSDP1 MixedPrecision", mixed_precision_policy=MixedPrecision(param_dtype=torch.float16))
    _build(api, "FSDP2 MixedPrecision", fsdp_version=2, mixed_precision_policy=MixedPrecision())
    _build(api, "FSDP2 MixedPrecisionPolicy", fsdp_version=2, mixed_precision_policy=MixedPrecisionPolicy())
    for version in (1, 2):
        plugin = api.get(PLUGIN)(fsdp_version=version)
        api.observe(f"FSDP{version} set_mixed_precision('bf16')", plugin.set_mixed_precision, "bf16")
        api.record(f"FSDP{version} after set_mixed_precision", plugin.mixed_precision_policy)
        api.observe(f"FSDP{version} set_mixed_precision keeps a policy", plugin.set_mixed_precision, "fp16")
        api.record(f"FSDP{version} after keeping", plugin.mixed_precision_policy)
        api.observe(f"FSDP{version} override with buffer autocast", plugin.set_mixed_precision, torch.float16,
                    buffer_autocast=True, override=True)
        api.record(f"FSDP{version} after override", plugin.mixed_precision_policy)
        api.observe(f"FSDP{version} set_mixed_precision(float64)", plugin.set_mixed_precision, torch.float64)
        api.observe(f"FSDP{version} set_mixed_precision('int8')", plugin.set_mixed_precision, "int8")
        api.observe(f"FSDP{version} validate_mixed_precision_policy", plugin.validate_mixed_precision_policy)
        plugin.mixed_precision_policy = "fp16"
        api.observe(f"FSDP{version} validate a string policy", plugin.validate_mixed_precision_policy)
        plugin.cpu_offload = True
        api.observe(f"FSDP{version} validate_cpu_offload of a bool", plugin.validate_cpu_offload)
        api.observe(f"FSDP{version} set_cpu_offload", plugin.set_cpu_offload)
        api.record(f"FSDP{version} after set_cpu_offload", plugin.cpu_offload)
        api.observe(f"FSDP{version} validate_cpu_offload", plugin.validate_cpu_offload)
