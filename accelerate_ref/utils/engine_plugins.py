"""Engine plugins and recipes passed to the Accelerator: FSDP, DeepSpeed, FP8, bitsandbytes.

DeepSpeed's dataclasses are defined in `deepspeed_plugin` and re-exported here.

Re-exported by `accelerate_ref.utils.dataclasses` (where HF keeps them). Each
class validates its fields at construction, naming the bad field; whether the
engine is installed is checked by the Accelerator (`engines.refuse_missing`).
Megatron-LM's plugin has its own module, `megatron_plugin`.

Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_state_dict,
plugin.fsdp_wrap_policy, plugin.deepspeed_config, plugin.unavailable_engines,
quantization.load_and_quantize.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .dataclasses import KwargsHandler, _check
from .deepspeed_plugin import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig  # noqa: F401  (re-exported)

#: FSDP1's sharding strategies, by name and by their documented 1-based number.
FSDP_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
FSDP_STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")


def _named_choice(value: Any, choices: tuple[str, ...], field_name: str) -> str:
    """``value`` (a name in any case, an enum with a ``name``, or a 1-based index) as one of ``choices``."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(choices):
        return choices[value - 1]
    name = str(getattr(value, "name", value)).upper()
    _check(name in choices, f"{field_name} must be one of {', '.join(choices)}; got {value!r}")
    return name


@dataclass
class FullyShardedDataParallelPlugin:
    """How `prepare_model` shards a model with torch's FSDP (``fully_shard`` on a device mesh).

    Fields: ``sharding_strategy`` (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD,
    HYBRID_SHARD, HYBRID_SHARD_ZERO2: a name, torch's ``ShardingStrategy``
    or its number 1-5), ``auto_wrap_policy`` ("transformer_based_wrap" with
    ``transformer_cls_names_to_wrap``, "size_based_wrap" with
    ``min_num_params``, "no_wrap", or a callable ``(module) -> bool``),
    ``state_dict_type`` (FULL_STATE_DICT / SHARDED_STATE_DICT),
    ``cpu_offload``, ``mixed_precision_policy`` (a dict of
    ``param_dtype``/``reduce_dtype``/``output_dtype`` or torch's
    ``MixedPrecisionPolicy``), ``cpu_ram_efficient_loading``,
    ``sync_module_states``, ``activation_checkpointing``, ``fsdp_version``
    (1 or 2; both are served by FSDP2 here), ``reshard_after_forward``.
    Rule: an unknown strategy, policy or state dict type is a ValueError
    naming the field. Catalog: plugin.fsdp, plugin.fsdp_strategies,
    plugin.fsdp_wrap_policy, plugin.fsdp_state_dict.
    """

    fsdp_version: int = 1
    sharding_strategy: Any = "FULL_SHARD"
    reshard_after_forward: Optional[bool] = None
    auto_wrap_policy: Union[str, Callable, None] = None
    transformer_cls_names_to_wrap: Optional[list[str]] = None
    min_num_params: Optional[int] = None
    state_dict_type: Any = "FULL_STATE_DICT"
    cpu_offload: bool = False
    mixed_precision_policy: Any = None
    cpu_ram_efficient_loading: bool = False
    sync_module_states: bool = True
    activation_checkpointing: bool = False
    use_orig_params: bool = True
    backward_prefetch: Any = None
    forward_prefetch: bool = False
    limit_all_gathers: bool = True

    def __post_init__(self) -> None:
        _check(self.fsdp_version in (1, 2), f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}")
        self.sharding_strategy = _named_choice(self.sharding_strategy, FSDP_SHARDING_STRATEGIES, "sharding_strategy")
        self.state_dict_type = _named_choice(self.state_dict_type, FSDP_STATE_DICT_TYPES, "state_dict_type")
        if isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = _named_choice(self.auto_wrap_policy, FSDP_AUTO_WRAP_POLICIES, "auto_wrap_policy").lower()
        else:
            _check(
                self.auto_wrap_policy is None or callable(self.auto_wrap_policy),
                f"auto_wrap_policy must be a policy name or a callable, got {self.auto_wrap_policy!r}",
            )
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [n for n in self.transformer_cls_names_to_wrap.split(",") if n]
        if self.min_num_params is not None:
            _check(self.min_num_params >= 0, f"min_num_params must be >= 0, got {self.min_num_params}")
        if self.reshard_after_forward is None:
            self.reshard_after_forward = self.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
        if isinstance(self.mixed_precision_policy, dict):
            allowed = {"param_dtype", "reduce_dtype", "output_dtype", "buffer_dtype", "cast_forward_inputs"}
            unknown = sorted(set(self.mixed_precision_policy) - allowed)
            _check(not unknown, f"mixed_precision_policy has unknown key(s) {unknown}; allowed: {sorted(allowed)}")

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Fill an unset `mixed_precision_policy` from the Accelerator's ``mixed_precision`` (fp16/bf16)."""
        import torch

        dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
        if self.mixed_precision_policy is None and mixed_precision in dtypes:
            self.mixed_precision_policy = {"param_dtype": dtypes[mixed_precision], "reduce_dtype": dtypes[mixed_precision]}


def get_module_class_from_name(module: Any, name: str) -> Optional[type]:
    """The class named ``name`` among ``module`` (an ``nn.Module``) and its descendants, or None.

    Catalog: plugin.fsdp_wrap_policy.
    """
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


#: FP8 backends and the package each needs.
FP8_BACKEND_PACKAGES = {"TE": "transformer_engine", "MSAMP": "msamp", "AO": "torchao"}


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """The FP8 recipe for ``mixed_precision="fp8"``: ``backend`` TE, MSAMP or AO and its options.

    Rule: an unknown backend, ``fp8_format`` or MS-AMP ``opt_level`` is a
    ValueError naming the field; ``margin`` is >= 0 and ``interval`` >= 1.
    Catalog: plugin.unavailable_engines.
    """

    backend: Optional[str] = None
    use_autocast_during_eval: bool = False
    margin: int = 0
    interval: int = 1
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "most_recent"
    opt_level: str = "O2"

    def __post_init__(self) -> None:
        backend = self.backend if self.backend is not None else os.environ.get("ACCELERATE_FP8_BACKEND", "TE")
        self.backend = str(backend).upper()
        _check(self.backend in FP8_BACKEND_PACKAGES, f"backend must be one of {sorted(FP8_BACKEND_PACKAGES)}, got {backend!r}")
        self.fp8_format = str(self.fp8_format).upper()
        _check(self.fp8_format in ("HYBRID", "E4M3", "E5M2"), f"fp8_format must be HYBRID, E4M3 or E5M2, got {self.fp8_format!r}")
        _check(self.amax_compute_algo in ("max", "most_recent"), f"amax_compute_algo must be max or most_recent, got {self.amax_compute_algo!r}")
        _check(self.opt_level in ("O1", "O2"), f"opt_level must be O1 or O2, got {self.opt_level!r}")
        _check(self.margin >= 0, f"margin must be >= 0, got {self.margin}")
        _check(self.interval >= 1, f"interval must be >= 1, got {self.interval}")

    @property
    def package(self) -> str:
        """The package the backend needs."""
        return FP8_BACKEND_PACKAGES[self.backend]


@dataclass
class BnbQuantizationConfig:
    """bitsandbytes quantization for `load_and_quantize_model`: exactly one of 8-bit and 4-bit.

    Rule: both or neither of ``load_in_8bit``/``load_in_4bit`` is a
    ValueError naming both; ``bnb_4bit_quant_type`` is fp4 or nf4; dtypes may
    be given as "fp32"/"fp16"/"bf16"; module lists are lists.
    Catalog: quantization.load_and_quantize.
    """

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: Optional[list[str]] = None
    keep_in_fp32_modules: Optional[list[str]] = None

    def __post_init__(self) -> None:
        _check(isinstance(self.load_in_8bit, bool), "load_in_8bit must be a bool")
        _check(isinstance(self.load_in_4bit, bool), "load_in_4bit must be a bool")
        _check(not (self.load_in_8bit and self.load_in_4bit), "load_in_8bit and load_in_4bit cannot both be True")
        _check(self.load_in_8bit or self.load_in_4bit, "one of load_in_8bit and load_in_4bit must be True")
        _check(self.bnb_4bit_quant_type in ("fp4", "nf4"), f"bnb_4bit_quant_type must be fp4 or nf4, got {self.bnb_4bit_quant_type!r}")
        self.bnb_4bit_compute_dtype = _dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        self.torch_dtype = None if self.torch_dtype is None else _dtype(self.torch_dtype, "torch_dtype")
        for name in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, name)
            _check(value is None or isinstance(value, list), f"{name} must be a list of module names, got {value!r}")


def _dtype(value: Any, field_name: str) -> Any:
    import torch

    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if isinstance(value, torch.dtype):
        return value
    _check(value in names, f"{field_name} must be fp32, fp16, bf16 or a torch.dtype, got {value!r}")
    return names[value]
