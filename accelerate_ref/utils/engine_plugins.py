"""Engine plugins passed to the Accelerator: FSDP, DeepSpeed, Megatron-LM, bitsandbytes (FP8 recipes: `low_precision`).

Re-exported by `accelerate_ref.utils.dataclasses` (where HF keeps them). Each
class validates its fields at construction, naming the bad field; whether the
engine is installed is checked by the Accelerator (`engines.refuse_missing`).

Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_state_dict,
plugin.fsdp_wrap_policy, plugin.deepspeed_config, plugin.unavailable_engines,
quantization.load_and_quantize.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from .dataclasses import _check

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


#: DeepSpeedPlugin field -> the dotted key of the DeepSpeed config it sets.
DEEPSPEED_PLUGIN_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}


@dataclass
class DeepSpeedPlugin:
    """A DeepSpeed configuration: a config (dict or JSON file path) and the plugin's own fields.

    Rules: ``hf_ds_config`` that does not parse is a ValueError naming the
    file; without one a config is built from the fields, with
    ``train_batch_size`` and ``train_micro_batch_size_per_gpu`` "auto". A
    plugin field that contradicts a non-"auto" config value is a ValueError
    naming the key; a config "auto" takes the field's value.
    `deepspeed_config_process(**values)` fills every remaining "auto" key
    from ``values`` (dotted keys) and refuses, naming them, keys whose set
    value differs. Catalog: plugin.deepspeed_config.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: Optional[int] = None
    is_train_batch_min: bool = True
    offload_optimizer_device: Optional[str] = None
    offload_param_device: Optional[str] = None
    zero3_init_flag: Optional[bool] = None
    zero3_save_16bit_model: Optional[bool] = None
    #: Whether this is the plugin `prepare` uses (one of ``Accelerator(deepspeed_plugins=...)``); see `select`.
    _selected: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def selected(self) -> bool:
        """Whether `AcceleratorState.select_deepspeed_plugin` made this the active plugin. Catalog: plugin.deepspeed_config."""
        return self._selected

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this the active plugin; only `AcceleratorState.select_deepspeed_plugin` may (HF's rule and words)."""
        if not _from_accelerator_state:
            raise ValueError(
                "A `DeepSpeedPlugin` object must be enabled manually by calling "
                "`AcceleratorState().enable_deepspeed_plugin(plugin_key)`."
            )
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    def __post_init__(self) -> None:
        if self.zero_stage is not None:
            _check(self.zero_stage in (0, 1, 2, 3), f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            _check(value in (None, "none", "cpu", "nvme"), f"{name} must be none, cpu or nvme, got {value!r}")
        if self.hf_ds_config is not None:
            self.deepspeed_config = _load_deepspeed_config(self.hf_ds_config)
            self.deepspeed_config.setdefault("gradient_accumulation_steps", 1)
            _check("zero_optimization" in self.deepspeed_config, "the DeepSpeed config needs a zero_optimization section")
            mismatches: list[str] = []
            for name, key in DEEPSPEED_PLUGIN_KEYS.items():
                if getattr(self, name) is not None:
                    self.fill_match(key, mismatches, **{key: getattr(self, name)})
            _raise_mismatches(mismatches)
            for name, key in DEEPSPEED_PLUGIN_KEYS.items():
                value = self.get_value(key)
                if value is not None and value != "auto":
                    setattr(self, name, value)
        else:
            self.zero_stage = 2 if self.zero_stage is None else self.zero_stage
            self.gradient_accumulation_steps = self.gradient_accumulation_steps or 1
            self.deepspeed_config = {
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "zero_optimization": {
                    "stage": self.zero_stage,
                    "offload_optimizer": {"device": self.offload_optimizer_device or "none"},
                    "offload_param": {"device": self.offload_param_device or "none"},
                    "stage3_gather_16bit_weights_on_model_save": bool(self.zero3_save_16bit_model),
                },
            }
            if self.gradient_clipping:
                self.deepspeed_config["gradient_clipping"] = self.gradient_clipping
        if self.zero3_init_flag is None:
            self.zero3_init_flag = self.get_value("zero_optimization.stage") == 3

    def _node(self, dotted_key: str) -> tuple[Optional[dict], str]:
        """The dict holding the last part of ``dotted_key`` (None where a parent is missing), and that part."""
        *parents, leaf = dotted_key.split(".")
        node: Any = self.deepspeed_config
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        return (node if isinstance(node, dict) else None), leaf

    def get_value(self, dotted_key: str, default: Any = None) -> Any:
        """The config value at ``dotted_key`` ("zero_optimization.stage"), or ``default``."""
        node, leaf = self._node(dotted_key)
        return default if node is None else node.get(leaf, default)

    def is_auto(self, dotted_key: str) -> bool:
        """Whether the config value at ``dotted_key`` is "auto"."""
        return self.get_value(dotted_key) == "auto"

    def fill_match(self, dotted_key: str, mismatches: Optional[list[str]] = None, must_match: bool = True, **values: Any) -> None:
        """Fill "auto" at ``dotted_key`` from ``values``; record a set value that differs in ``mismatches``."""
        node, leaf = self._node(dotted_key)
        if node is None or leaf not in node:
            return
        if node[leaf] == "auto":
            _check(dotted_key in values, f"the DeepSpeed config key {dotted_key} is 'auto' and no value was given for it")
            node[leaf] = values[dotted_key]
        elif must_match and dotted_key in values and node[leaf] != values[dotted_key]:
            if mismatches is None:
                raise ValueError(f"DeepSpeed config {dotted_key}={node[leaf]!r} contradicts {values[dotted_key]!r}")
            mismatches.append(f"{dotted_key}: config {node[leaf]!r} vs {values[dotted_key]!r}")

    def deepspeed_config_process(self, must_match: bool = True, **values: Any) -> None:
        """Fill every "auto" config value from ``values`` (dotted keys); refuse contradictions by key."""
        mismatches: list[str] = []
        for key in _dotted_keys(self.deepspeed_config):
            self.fill_match(key, mismatches, must_match=must_match, **values)
        _raise_mismatches(mismatches)


def _dotted_keys(config: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        keys += _dotted_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else [prefix + key]
    return keys


def _raise_mismatches(mismatches: list[str]) -> None:
    if mismatches:
        raise ValueError("DeepSpeed config values contradict the given values (set them to 'auto'): " + "; ".join(mismatches))


def _load_deepspeed_config(config: Any) -> dict:
    """A deep copy of a config dict, or the parsed JSON file (or JSON text) ``config``; ValueError naming it if unparseable."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    config = os.fspath(config)
    try:
        if os.path.exists(config):
            with open(config, encoding="utf-8") as handle:
                loaded = json.load(handle)
        else:
            loaded = json.loads(config)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"hf_ds_config {config!r} is not a JSON DeepSpeed config: {error}") from None
    _check(isinstance(loaded, dict), f"hf_ds_config {config!r} must hold a JSON object")
    return loaded


@dataclass
class MegatronLMPlugin:
    """Megatron-LM parallelism: tensor/pipeline degrees, micro batches, sequence parallelism.

    Rule: degrees and micro batch counts are positive ints; sequence
    parallelism needs a tensor degree above 1. Catalog: plugin.unavailable_engines.
    """

    tp_degree: int = 1
    pp_degree: int = 1
    num_micro_batches: int = 1
    gradient_clipping: float = 1.0
    sequence_parallelism: bool = False
    recompute_activations: bool = False
    use_distributed_optimizer: bool = False
    pipeline_model_parallel_split_rank: Optional[int] = None
    num_layers_per_virtual_pipeline_stage: Optional[int] = None
    other_megatron_args: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, f"{name} must be a positive int, got {value!r}")
        _check(not self.sequence_parallelism or self.tp_degree > 1, "sequence_parallelism needs tp_degree > 1")


@dataclass
class BnbQuantizationConfig:
    """bitsandbytes quantization for `load_and_quantize_model`: exactly one of 8-bit and 4-bit.

    Rules (HF's): both or neither of ``load_in_8bit``/``load_in_4bit`` is a
    ValueError naming both; ``bnb_4bit_quant_type`` is fp4 or nf4;
    ``bnb_4bit_compute_dtype`` and ``torch_dtype`` may be given as
    "fp32"/"fp16"/"bf16"; ``torch_dtype`` (the dtype of the weights left
    unquantized) defaults to float16 for 8-bit and to the compute dtype for
    4-bit; ``target_dtype`` (how quantized weights are sized) is ``torch.int8``
    or ``CustomDtype.INT4``; module lists are lists; ``llm_int8_threshold``
    with 4-bit is warned about. Catalog: quantization.load_and_quantize.
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
        import torch

        from .low_precision import CustomDtype

        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            _check(isinstance(getattr(self, name), bool), f"{name} must be a boolean")
        _check(not (self.load_in_8bit and self.load_in_4bit), "load_in_4bit and load_in_8bit can't be both True")
        _check(self.load_in_8bit or self.load_in_4bit, "load_in_4bit and load_in_8bit can't be both False")
        _check(isinstance(self.llm_int8_threshold, (int, float)), "llm_int8_threshold must be a float or an int")
        _check(self.bnb_4bit_quant_type in ("fp4", "nf4"), f"bnb_4bit_quant_type must be in ['fp4','nf4'] but found {self.bnb_4bit_quant_type!r}")
        self.bnb_4bit_compute_dtype = _dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        for name in ("skip_modules", "keep_in_fp32_modules"):
            value = getattr(self, name)
            _check(value is None or isinstance(value, list), f"{name} must be a list of module names, got {value!r}")
        self.target_dtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold can only be used for model loaded in 8bit")
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        self.torch_dtype = _dtype(self.torch_dtype, "torch_dtype")


def _dtype(value: Any, field_name: str) -> Any:
    import torch

    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    if isinstance(value, torch.dtype):
        return value
    _check(value in names, f"{field_name} must be in ['fp32','fp16','bf16'] or a torch.dtype, got {value!r}")
    return names[value]
