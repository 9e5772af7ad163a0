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
from dataclasses import dataclass
from typing import Any, Optional

from .dataclasses import KwargsHandler, _check
from .deepspeed_plugin import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig  # noqa: F401  (re-exported)
from .fsdp_plugin import FullyShardedDataParallelPlugin, get_module_class_from_name  # noqa: F401  (their own module; HF's are here)


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
