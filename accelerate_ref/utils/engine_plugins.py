"""Engine plugins and recipes passed to the Accelerator: FSDP, DeepSpeed, Megatron-LM, FP8, bitsandbytes.

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
from dataclasses import dataclass, field
from typing import Any, Optional

from .dataclasses import KwargsHandler, _check
from .fsdp_plugin import FullyShardedDataParallelPlugin, get_module_class_from_name  # noqa: F401  (their own module; HF's are here)

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
