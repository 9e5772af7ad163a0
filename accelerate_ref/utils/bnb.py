"""Quantization of a model's ``nn.Linear`` layers through the real ``bitsandbytes`` package.

Follows HF 1.15's `accelerate.utils.bnb` step for step, with one deviation:
where HF needs a GPU (or Intel XPU) and raises RuntimeError("No GPU ...") on a
CPU-only machine, this reference quantizes on the CPU with bitsandbytes' CPU
backend (``Int8Params``/``Params4bit`` quantize when moved to a device), so
the documented behaviour can be checked anywhere. On a machine with an
accelerator the model goes to it, as in HF. Not provided: 8-bit weights
offloaded while loading (HF's ``offload_8bit_bnb``: "disk" in the device map,
or "cpu" next to an accelerator), refused by `load_checkpoint_in_model`.
Catalog: quantization.load_and_quantize.
"""

from __future__ import annotations

import logging
import os
from copy import deepcopy
from typing import Any, Optional, Union

import torch
from torch import nn

from ._dataclasses.bnb import BnbQuantizationConfig
from .imports import is_4bit_bnb_available, is_8bit_bnb_available

logger = logging.getLogger(__name__)

#: The bitsandbytes parameter classes that quantize their data when moved to a device.
QUANTIZED_PARAMETER_CLASSES = ("Int8Params", "FP4Params", "Params4bit")

DeviceMap = dict[str, Union[int, str, torch.device]]


def _accelerator_device() -> Optional[int]:
    """The current CUDA (else XPU) device index, or None on a machine with neither."""
    if torch.cuda.is_available():
        return torch.cuda.current_device()
    if torch.xpu.is_available():
        return torch.xpu.current_device()
    return None


def load_and_quantize_model(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: Optional[Union[str, os.PathLike]] = None,
    device_map: Optional[DeviceMap] = None,
    no_split_module_classes: Optional[list[str]] = None,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    offload_state_dict: bool = False,
) -> torch.nn.Module:
    """``model`` with its ``nn.Linear`` layers replaced by bitsandbytes 8-bit (or 4-bit) layers.

    Rules (HF's): bitsandbytes too old or absent is an ImportError for 8-bit
    (a ValueError for 4-bit), naming it. ``skip_modules`` None becomes
    `get_keys_to_not_convert(model)` (the last child module and tied
    weights); with 4-bit, modules ``device_map`` puts on "cpu"/"disk" are
    skipped too; ``keep_in_fp32_modules`` are skipped and kept float32; the
    config's lists are updated in place, as HF does. A loaded model is
    quantized where it is, its other floating weights cast to ``torch_dtype``,
    and moved to the accelerator (CPU-only: quantized on the CPU, see the module
    docstring). A model on the meta device needs ``weights_location`` (else
    RuntimeError): its layers are replaced empty, the checkpoint loaded as
    `get_quantized_model_device_map` places it, and the model dispatched.
    Catalog: quantization.load_and_quantize.
    """
    config = bnb_quantization_config
    if config.load_in_8bit and not is_8bit_bnb_available():
        raise ImportError(
            "You have a version of `bitsandbytes` that is not compatible with 8bit quantization,"
            " make sure you have the latest version of `bitsandbytes` installed."
        )
    if config.load_in_4bit and not is_4bit_bnb_available():
        raise ValueError(
            "You have a version of `bitsandbytes` that is not compatible with 4bit quantization,"
            "make sure you have the latest version of `bitsandbytes` installed."
        )
    modules_on_host = []
    if isinstance(device_map, dict) and len(device_map) > 1:
        modules_on_host = [name for name, device in device_map.items() if device in ("disk", "cpu")]
    if config.skip_modules is None:
        config.skip_modules = get_keys_to_not_convert(model)
    if config.load_in_4bit:
        config.skip_modules.extend(modules_on_host)
    if config.keep_in_fp32_modules is None:
        config.keep_in_fp32_modules = []
    modules_to_not_convert = config.skip_modules
    modules_to_not_convert.extend(config.keep_in_fp32_modules)
    model.is_loaded_in_4bit = config.load_in_4bit  # read by peft
    model.is_loaded_in_8bit = config.load_in_8bit

    model_device = get_parameter_device(model)
    if model_device.type != "meta":
        logger.warning(
            "It is not recommended to quantize a loaded model. "
            "The model should be instantiated under the `init_empty_weights` context manager."
        )
        model = replace_with_bnb_layers(model, config, modules_to_not_convert=modules_to_not_convert)
        _cast_unquantized(model, config.torch_dtype, config.keep_in_fp32_modules)
        accelerator = _accelerator_device()
        return model.to(model_device if accelerator is None else accelerator)
    if weights_location is None:
        raise RuntimeError(
            f"`weights_location` needs to be the folder path containing the weights of the model, but we found {weights_location} "
        )
    from ..big_modeling import dispatch_model, init_empty_weights
    from .modeling import load_checkpoint_in_model

    with init_empty_weights():
        model = replace_with_bnb_layers(model, config, modules_to_not_convert=modules_to_not_convert)
    device_map = get_quantized_model_device_map(
        model, config, device_map, max_memory=max_memory, no_split_module_classes=no_split_module_classes
    )
    if offload_state_dict is None and "disk" in device_map.values():
        offload_state_dict = True
    load_checkpoint_in_model(
        model,
        weights_location,
        device_map,
        dtype=config.torch_dtype,
        offload_folder=offload_folder,
        offload_state_dict=offload_state_dict,
        keep_in_fp32_modules=config.keep_in_fp32_modules,
        offload_8bit_bnb=config.load_in_8bit and _offloads(device_map),
    )
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder)


def quantized_parameter_like(old: nn.Parameter, value: torch.Tensor) -> Optional[nn.Parameter]:
    """For a bitsandbytes parameter ``old`` (``Int8Params``, ``Params4bit``), one of its class and settings holding
    ``value`` quantized on ``value``'s device; None for any other parameter.

    How `load_checkpoint_in_model` fills the empty layers of a model that
    `replace_with_bnb_layers` built on the meta device (HF's rule: 8-bit
    weights are quantized from float16). Catalog: quantization.load_and_quantize.
    """
    if type(old).__name__ not in QUANTIZED_PARAMETER_CLASSES:
        return None
    if type(old).__name__ == "Int8Params" and value.dtype == torch.float32:
        value = value.to(torch.float16)
    return type(old)(value, requires_grad=old.requires_grad, **old.__dict__).to(value.device)


def _host_devices() -> set[str]:
    """The device map entries that offload: "cpu" and "disk" (only "disk" on a CPU-only machine, where the CPU computes)."""
    return {"disk"} if _accelerator_device() is None else {"cpu", "disk"}


def _offloads(device_map: DeviceMap) -> bool:
    """Whether ``device_map`` keeps weights off the compute device."""
    return bool(set(device_map.values()) & _host_devices())


def _cast_unquantized(model: nn.Module, dtype: torch.dtype, keep_in_fp32_modules: list[str]) -> None:
    """Cast floating weights to ``dtype``, those of ``keep_in_fp32_modules`` (by substring, tied aliases too) to float32."""
    for name, param in model.named_parameters(remove_duplicate=False):
        if any(kept in name for kept in keep_in_fp32_modules):
            param.data = param.data.to(torch.float32)
        elif torch.is_floating_point(param):
            param.data = param.data.to(dtype)
    for name, module in model.named_modules():  # a tied weight may have been seen first under its other name
        if any(kept in name for kept in keep_in_fp32_modules):
            for param in module.parameters(recurse=False):
                param.data = param.data.to(torch.float32)


def get_quantized_model_device_map(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: Union[DeviceMap, str, None] = None,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
) -> DeviceMap:
    """The device map to load a quantized model with.

    Rules (HF's): None is the whole model on the current accelerator (CPU-only:
    on the CPU, see the module docstring); "auto", "balanced",
    "balanced_low_0" and "sequential" are inferred with
    `infer_auto_device_map`, sizing quantized weights with the config's
    ``target_dtype`` and ``skip_modules`` / ``keep_in_fp32_modules`` with
    ``torch_dtype`` / float32; another string is a ValueError. With 4-bit,
    a quantized module mapped to "cpu" or "disk" is a ValueError.
    Catalog: quantization.load_and_quantize.
    """
    config = bnb_quantization_config
    if device_map is None:
        accelerator = _accelerator_device()
        device_map = {"": "cpu" if accelerator is None else accelerator}
        logger.info(f"The device_map was not initialized. Setting device_map to {device_map}.")
    if isinstance(device_map, str):
        device_map = _inferred_device_map(model, config, device_map, max_memory, no_split_module_classes)
    if isinstance(device_map, dict):
        not_converted = set(config.skip_modules) | set(config.keep_in_fp32_modules)
        quantized_devices = {device for name, device in device_map.items() if name not in not_converted}
        on_host = bool(quantized_devices & _host_devices())
        if on_host and config.load_in_4bit:
            raise ValueError(
                "Some modules are dispatched on the CPU or the disk. Make sure you have enough GPU RAM to fit the "
                "quantized model. If you want to dispatch the model on the CPU or the disk while keeping these modules "
                "in `torch_dtype`, you need to pass a custom `device_map` to `load_and_quantize_model`."
            )
        if on_host:
            logger.info("Some modules are offloaded to the CPU or the disk. Note that these modules will be converted to 8-bit")
    return device_map


def _inferred_device_map(
    model: nn.Module,
    config: BnbQuantizationConfig,
    strategy: str,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]],
    no_split_module_classes: Optional[list[str]],
) -> DeviceMap:
    """`infer_auto_device_map` for ``strategy`` ("auto", "balanced", "balanced_low_0", "sequential") with quantized sizes."""
    from .modeling import get_balanced_memory, infer_auto_device_map

    if strategy not in ("auto", "balanced", "balanced_low_0", "sequential"):
        raise ValueError(
            "If passing a string for `device_map`, please choose 'auto', 'balanced', 'balanced_low_0' or 'sequential'."
        )
    special_dtypes = {name: config.torch_dtype for name, _ in model.named_parameters() if any(m in name for m in config.skip_modules)}
    special_dtypes.update(
        {name: torch.float32 for name, _ in model.named_parameters() if any(m in name for m in config.keep_in_fp32_modules)}
    )
    kwargs: dict[str, Any] = {
        "special_dtypes": special_dtypes,
        "no_split_module_classes": no_split_module_classes,
        "dtype": config.target_dtype,
    }
    if strategy != "sequential":
        max_memory = get_balanced_memory(model, low_zero=strategy == "balanced_low_0", max_memory=max_memory, **kwargs)
    return infer_auto_device_map(model, max_memory=max_memory, **kwargs)


def replace_with_bnb_layers(
    model: nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: Optional[list[str]] = None,
    current_key_name: Optional[list[str]] = None,
) -> nn.Module:
    """``model`` with each ``nn.Linear`` replaced (in place) by ``bnb.nn.Linear8bitLt`` or ``bnb.nn.Linear4bit``.

    Rules (HF's): a Linear is kept when its own name is in
    ``modules_to_not_convert``, or its dotted name equals an entry or
    contains ``entry + "."``; the new layer takes the old weight and bias
    data unquantized (bitsandbytes quantizes when the layer is moved to a
    device) and needs no gradients. Finding no Linear is logged as a warning.
    ``current_key_name`` is the dotted prefix of ``model`` (a list of names).
    Catalog: quantization.load_and_quantize.
    """
    replaced = _replace_linear_layers(model, bnb_quantization_config, modules_to_not_convert or [], list(current_key_name or []))
    if not replaced:
        logger.warning(
            "You are loading your model in 8bit or 4bit but no linear modules were found in your model."
            " this can happen for some architectures such as gpt2 that uses Conv1D instead of Linear layers."
            " Please double check your model architecture, or submit an issue on github if you think this is"
            " a bug."
        )
    return model


def _kept(name: str, dotted_name: str, modules_to_not_convert: list[str]) -> bool:
    if name in modules_to_not_convert:
        return True
    return any(key == dotted_name or key + "." in dotted_name for key in modules_to_not_convert)


def _replace_linear_layers(model: nn.Module, config: BnbQuantizationConfig, modules_to_not_convert: list[str], prefix: list[str]) -> bool:
    """Replace the Linear children of ``model`` (named ``prefix``) and below; whether any was replaced."""
    replaced = False
    for name, module in model.named_children():
        key = prefix + [name]
        if isinstance(module, nn.Linear) and not _kept(name, ".".join(key), modules_to_not_convert):
            setattr(model, name, _bnb_linear(module, config))
            replaced = True
        if next(module.children(), None) is not None:
            replaced = _replace_linear_layers(module, config, modules_to_not_convert, key) or replaced
    return replaced


def _bnb_linear(linear: nn.Linear, config: BnbQuantizationConfig) -> nn.Module:
    """A bitsandbytes layer of ``linear``'s shape holding its (not yet quantized) weight and bias."""
    import bitsandbytes as bnb  # imported late: bitsandbytes initialises devices on import

    has_bias = linear.bias is not None
    if config.load_in_8bit:
        layer = bnb.nn.Linear8bitLt(
            linear.in_features, linear.out_features, has_bias, has_fp16_weights=False, threshold=config.llm_int8_threshold
        )
    elif config.load_in_4bit:
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            has_bias,
            config.bnb_4bit_compute_dtype,
            compress_statistics=config.bnb_4bit_use_double_quant,
            quant_type=config.bnb_4bit_quant_type,
        )
    else:
        raise ValueError("load_in_8bit and load_in_4bit can't be both False")
    layer.weight.data = linear.weight.data
    if has_bias:
        layer.bias.data = linear.bias.data
    layer.requires_grad_(False)
    return layer


def get_keys_to_not_convert(model: nn.Module) -> list[str]:
    """The module names to keep unquantized: the model's last child and its tied weights.

    Rules (HF's): a base model (one with ``base_model_prefix`` but no
    attribute of that name) without tied weights gives []; otherwise the
    names of the tied parameters and the last child module, with ".weight"
    and ".bias" removed. Catalog: quantization.load_and_quantize.
    """
    from ..big_modeling import init_empty_weights
    from .modeling import find_tied_parameters

    with init_empty_weights():
        tied_model = deepcopy(model)  # costs nothing: the copy's weights are on the meta device
    tied_keys = [name for group in find_tied_parameters(tied_model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = prefix is not None and not hasattr(model, prefix)
    if not tied_keys and is_base_model:
        return []
    last_child = list(model.named_children())[-1][0]
    untouched = list(set(tied_keys)) + list({last_child} - set(tied_keys))
    return [name.replace(".weight", "").replace(".bias", "") for name in untouched]


def has_4bit_bnb_layers(model: nn.Module) -> bool:
    """Whether ``model`` holds a ``bnb.nn.Linear4bit`` layer. Catalog: quantization.load_and_quantize."""
    import bitsandbytes as bnb

    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def get_parameter_device(parameter: nn.Module) -> torch.device:
    """The device of the module's first parameter (StopIteration for a module without any)."""
    return next(parameter.parameters()).device


def quantize_and_offload_8bit(
    model: nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype,
    offload_folder: Union[str, os.PathLike],
    offload_index: dict,
    fp16_statistics: Optional[torch.Tensor],
) -> None:
    """Write the 8-bit weight ``param_name`` (and its ``SCB`` statistics) to ``offload_folder``; leave it on meta.

    Rules (HF's): without ``fp16_statistics`` the weight is put in the model
    first, which quantizes it (on the accelerator; CPU-only: on the CPU), and
    the quantized data and its ``SCB`` are offloaded; with them, ``param``
    is taken as quantized and offloaded with the statistics. ``offload_index``
    is updated; the model's tensor ends on the meta device in ``new_dtype``.
    Catalog: quantization.load_and_quantize.
    """
    from .modeling import offload_weight, set_module_tensor_to_device

    scb_name = param_name.replace("weight", "SCB")
    if fp16_statistics is None:
        accelerator = _accelerator_device()
        set_module_tensor_to_device(model, param_name, "cpu" if accelerator is None else accelerator, dtype=new_dtype, value=param)
        owner_name, _, tensor_name = param_name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        quantized = owner._parameters[tensor_name]
        quantized.requires_grad = False
        offload_weight(quantized, param_name, offload_folder, index=offload_index)
        if hasattr(quantized, "SCB"):
            offload_weight(quantized.SCB, scb_name, offload_folder, index=offload_index)
    else:
        offload_weight(param, param_name, offload_folder, index=offload_index)
        offload_weight(fp16_statistics, scb_name, offload_folder, index=offload_index)
    set_module_tensor_to_device(model, param_name, "meta", dtype=new_dtype, value=torch.empty(*param.size()))
