"""Quantization of a model's ``nn.Linear`` layers through the real ``bitsandbytes`` package.

Catalog: quantization.load_and_quantize.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .engine_plugins import BnbQuantizationConfig
from .imports import is_bnb_available


def load_and_quantize_model(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: Optional[str] = None,
    device_map: Optional[dict[str, Any]] = None,
    **_offload_options: Any,
) -> torch.nn.Module:
    """``model`` with its ``nn.Linear`` layers replaced by bitsandbytes 8-bit (or 4-bit) layers.

    Rules: layers named in ``skip_modules`` or ``keep_in_fp32_modules`` (by
    name or name prefix) stay ``nn.Linear`` (the latter in fp32); weights
    come from ``weights_location`` when given, else from ``model``; without
    bitsandbytes, an ImportError names it. ``device_map`` other than one
    device is not provided by this reference (NotImplementedError).
    Catalog: quantization.load_and_quantize.
    """
    if not is_bnb_available():
        raise ImportError("load_and_quantize_model needs the `bitsandbytes` package, which is not installed (pip install bitsandbytes)")
    if device_map is not None and len(set(device_map.values())) > 1:
        raise NotImplementedError("load_and_quantize_model: accelerate_ref quantizes on one device only")
    import bitsandbytes as bnb

    if weights_location is not None:
        from .modeling import load_checkpoint_in_model

        load_checkpoint_in_model(model, weights_location)
    config = bnb_quantization_config
    kept = list(config.skip_modules or []) + list(config.keep_in_fp32_modules or [])
    for name, module in list(model.named_modules()):
        if not isinstance(module, torch.nn.Linear) or any(name == k or name.startswith(k + ".") for k in kept):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _quantized(bnb, module, config))
    for name in config.keep_in_fp32_modules or []:
        model.get_submodule(name).float()
    return model


def _quantized(bnb: Any, linear: torch.nn.Linear, config: BnbQuantizationConfig) -> torch.nn.Module:
    has_bias = linear.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(
            linear.in_features, linear.out_features, bias=has_bias, has_fp16_weights=False, threshold=config.llm_int8_threshold
        )
        layer.weight = bnb.nn.Int8Params(linear.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=has_bias,
            compute_dtype=config.bnb_4bit_compute_dtype,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
        )
        layer.weight = bnb.nn.Params4bit(linear.weight.data.clone(), requires_grad=False, quant_type=config.bnb_4bit_quant_type)
    if has_bias:
        layer.bias = torch.nn.Parameter(linear.bias.data.clone(), requires_grad=False)
    return layer.to(linear.weight.device)
