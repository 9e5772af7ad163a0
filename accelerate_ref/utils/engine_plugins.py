"""Engine plugins passed to the Accelerator: FSDP, DeepSpeed, bitsandbytes (FP8 recipes: `low_precision`).

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

import warnings
from dataclasses import dataclass
from typing import Any, Optional

from .dataclasses import _check
from .deepspeed_plugin import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig  # noqa: F401  (re-exported)
from .fsdp_plugin import FullyShardedDataParallelPlugin, get_module_class_from_name  # noqa: F401  (their own module; HF's are here)


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
