"""`BnbQuantizationConfig`: bitsandbytes quantization settings for `load_and_quantize_model`.

Re-exported by `accelerate_ref.utils.dataclasses` (where HF keeps it). It
validates its fields at construction, naming the bad field, with HF 1.15's words.

Catalog: quantization.load_and_quantize.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

from .base import check


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
    with 4-bit is warned about. The checks run in HF's order, with HF's
    messages. Catalog: quantization.load_and_quantize.
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

        check(isinstance(self.load_in_8bit, bool), "load_in_8bit must be a boolean")
        check(isinstance(self.load_in_4bit, bool), "load_in_4bit must be a boolean")
        check(not (self.load_in_4bit and self.load_in_8bit), "load_in_4bit and load_in_8bit can't be both True")
        check(self.load_in_4bit or self.load_in_8bit, "load_in_4bit and load_in_8bit can't be both False")
        check(isinstance(self.llm_int8_threshold, (int, float)), "llm_int8_threshold must be a float or an int")
        check(isinstance(self.bnb_4bit_quant_type, str), "bnb_4bit_quant_type must be a string")
        check(self.bnb_4bit_quant_type in ("fp4", "nf4"),
               f"bnb_4bit_quant_type must be in ['fp4','nf4'] but found {self.bnb_4bit_quant_type}")
        check(isinstance(self.bnb_4bit_use_double_quant, bool), "bnb_4bit_use_double_quant must be a boolean")
        if isinstance(self.bnb_4bit_compute_dtype, str):
            self.bnb_4bit_compute_dtype = _dtype_by_name(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        check(isinstance(self.bnb_4bit_compute_dtype, torch.dtype), "bnb_4bit_compute_dtype must be a string or a torch.dtype")
        check(self.skip_modules is None or isinstance(self.skip_modules, list), "skip_modules must be a list of strings")
        check(self.keep_in_fp32_modules is None or isinstance(self.keep_in_fp32_modules, list),
               "keep_in_fp_32_modules must be a list of strings")
        self.target_dtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold can only be used for model loaded in 8bit")
        if isinstance(self.torch_dtype, str):
            self.torch_dtype = _dtype_by_name(self.torch_dtype, "torch_dtype")
        if self.torch_dtype is None:
            self.torch_dtype = torch.float16 if self.load_in_8bit else self.bnb_4bit_compute_dtype
        check(isinstance(self.torch_dtype, torch.dtype), "torch_dtype must be a torch.dtype")


def _dtype_by_name(name: str, field_name: str) -> Any:
    """"fp32", "fp16" or "bf16" as torch's dtype; another name is a ValueError naming ``field_name`` (HF's text)."""
    import torch

    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    check(name in names, f"{field_name} must be in ['fp32','fp16','bf16'] but found {name}")
    return names[name]
