"""Big-model inference: build a model without memory, load it where a device map says, run it through hooks.

Catalog: section "Big-model inference" (bigmodel.init_empty_weights,
bigmodel.dispatch_model, bigmodel.load_checkpoint_and_dispatch,
bigmodel.cpu_offload, bigmodel.cpu_offload_with_hook), and layerwise casting
(`attach_layerwise_casting_hooks`, HF 1.15's, outside the seed documents).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from contextlib import contextmanager
from functools import wraps
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import nn

from .hooks import (
    AlignDevicesHook,
    CpuOffload,
    LayerwiseCastingHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from .utils.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
from .utils.environment import check_cuda_p2p_ib_support, parse_flag_from_env
from .utils.imports import (
    is_bnb_available,
    is_mlu_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_sdaa_available,
    is_xpu_available,
)
from .utils.modeling import (
    check_device_map,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
    retie_parameters,
)
from .utils._modeling.sizes import MaxMemory
from .utils.offload import INDEX_NAME, OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict
from .utils.other import recursive_getattr

logger = logging.getLogger(__name__)

Device = Union[int, str, torch.device]
DeviceMap = dict[str, Device]

#: The strategies ``load_checkpoint_and_dispatch`` accepts as ``device_map``.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
#: The accelerator families whose device a bare int names in ``dispatch_model`` (the first available wins),
#: with the method `dispatch_model` guards on the model; CUDA's ``cuda`` otherwise.
_FAMILIES = (("npu", is_npu_available), ("mlu", is_mlu_available), ("sdaa", is_sdaa_available),
             ("musa", is_musa_available), ("xpu", is_xpu_available), ("neuron", is_neuron_available))


@contextmanager
def init_empty_weights(include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Inside, modules create their parameters on ``meta`` (no memory); buffers too with ``include_buffers``.

    ``include_buffers`` defaults to ``ACCELERATE_INIT_INCLUDE_BUFFERS``.
    Catalog: bigmodel.init_empty_weights.
    """
    if include_buffers is None:
        include_buffers = parse_flag_from_env("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as context:
        yield context


@contextmanager
def init_on_device(device: Device, include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Inside, modules create their parameters on ``device`` (and buffers, with ``include_buffers``).

    Rules (HF 1.15's): with ``include_buffers`` every tensor created inside
    lands on ``device`` through torch's device context, so ``device`` must
    be a ``torch.device`` (a string is the TypeError of ``with``); without,
    each registered parameter is moved there, keeping its class, its
    ``requires_grad`` and a ``_is_hf_initialized`` mark.
    Catalog: bigmodel.init_empty_weights.
    """
    if include_buffers is None:
        include_buffers = parse_flag_from_env("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    if include_buffers:
        with device:
            yield
        return
    original = nn.Module.register_parameter

    def register_on_device(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is not None:
            registered = module._parameters[name]
            extra = dict(registered.__dict__)
            extra["requires_grad"] = param.requires_grad
            mark = extra.pop("_is_hf_initialized", None)
            module._parameters[name] = type(registered)(registered.to(device), **extra)
            if mark is not None:
                module._parameters[name]._is_hf_initialized = mark

    nn.Module.register_parameter = register_on_device
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def _first_device(model: nn.Module) -> torch.device:
    return next(iter(model.parameters())).device


def cpu_offload(
    model: nn.Module,
    execution_device: Optional[Device] = None,
    offload_buffers: bool = False,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    preload_module_classes: Optional[list[str]] = None,
) -> nn.Module:
    """Keep the weights of ``model`` on the CPU, bringing each submodule's to ``execution_device`` for its forward.

    Outputs come back on the device of the inputs. Catalog: bigmodel.cpu_offload.
    """
    if state_dict is None:
        state_dict = {name: tensor.to("cpu") for name, tensor in model.state_dict().items()}
    return _offload_submodules(model, execution_device, state_dict, offload_buffers, preload_module_classes)


def disk_offload(
    model: nn.Module,
    offload_dir: Union[str, os.PathLike],
    execution_device: Optional[Device] = None,
    offload_buffers: bool = False,
    preload_module_classes: Optional[list[str]] = None,
) -> nn.Module:
    """Keep the weights of ``model`` in ``offload_dir`` (written there unless it holds an ``index.json``), reading
    each submodule's weights to ``execution_device`` for its forward. Catalog: bigmodel.cpu_offload.
    """
    if not os.path.isfile(os.path.join(os.fspath(offload_dir), INDEX_NAME)):
        offload_state_dict(offload_dir, model.state_dict())
    weights_map = OffloadedWeightsLoader(save_folder=offload_dir)
    return _offload_submodules(model, execution_device, weights_map, offload_buffers, preload_module_classes)


def _offload_submodules(
    model: nn.Module,
    execution_device: Optional[Device],
    weights_map: Mapping,
    offload_buffers: bool,
    preload_module_classes: Optional[list[str]],
) -> nn.Module:
    """Hooks that read each submodule's weights from ``weights_map`` to ``execution_device`` for its forward,
    with outputs returned where the inputs were (`cpu_offload`, `disk_offload`)."""
    execution_device = _first_device(model) if execution_device is None else execution_device
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    attach_align_device_hook(
        model, execution_device, offload=True, weights_map=weights_map, offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
    )
    return model


def cpu_offload_with_hook(
    model: nn.Module, execution_device: Optional[Device] = None, prev_module_hook: Optional[UserCpuOffloadHook] = None
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Move the whole ``model`` to ``execution_device`` at its forward, and back to the CPU on ``hook.offload()``.

    ``prev_module_hook`` is offloaded when this model runs, which chains a
    pipeline of models. Catalog: bigmodel.cpu_offload_with_hook.
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def dispatch_model(
    model: nn.Module,
    device_map: DeviceMap,
    main_device: Optional[Device] = None,
    state_dict: Optional[dict[str, torch.Tensor]] = None,
    offload_dir: Optional[Union[str, os.PathLike]] = None,
    offload_index: Optional[dict] = None,
    offload_buffers: bool = False,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Place ``model`` as ``device_map`` says and add the hooks that run it there.

    Rules (HF 1.15's, with its messages): the map is checked first
    (`check_device_map`). One device and no ``force_hooks`` (forced for an
    8-bit or 4-bit bitsandbytes model on an old bitsandbytes): the model
    moves there, no hooks (an int on NPU, MLU, SDAA, MUSA or Neuron names
    that family's device, where HF does not move the model at all). Otherwise each block runs on its device and
    inputs follow through hooks; ``"cpu"`` and ``"disk"`` blocks stay
    offloaded (weights on ``meta``, read from the CPU state dict or
    ``offload_dir``, logged as a warning) and run on ``main_device`` (the
    first accelerator of the map, else the CPU, where ``"cpu"`` blocks are
    not offloaded), brought there only for their forward; tied weights are
    brought once per device and tied again; the output comes back where the
    input was. Disk blocks need ``offload_dir`` or ``offload_index`` (a
    ValueError naming them); their weights are written there unless it
    already holds an ``index.json``. The dispatched model's ``to`` (and its
    accelerator's move method, ``cuda`` by default) log a warning when
    asked to move and refuse (RuntimeError) while weights are offloaded.
    ``model.hf_device_map`` records the map. Catalog: bigmodel.dispatch_model.
    """
    check_device_map(model, device_map)
    if getattr(model, "quantization_method", "bitsandbytes") == "bitsandbytes":
        if (getattr(model, "is_loaded_in_8bit", False) and not is_bnb_available(min_version="0.48.0")) or (
            getattr(model, "is_loaded_in_4bit", False) and not is_bnb_available(min_version="0.43.2")
        ):
            force_hooks = True
    devices = set(device_map.values())
    if len(devices) > 1 or "disk" in devices or force_hooks:
        _dispatch_with_hooks(model, device_map, main_device, state_dict, offload_dir, offload_index, offload_buffers,
                             skip_keys, preload_module_classes)
    else:
        device = list(devices)[0]
        family = next((name for name, available in _FAMILIES if name != "xpu" and available()), None)
        # An int is that family's device (torch_npu refuses Tensor.to(<int>)); HF names it so but then skips
        # the move on these families, which leaves the model where it was: accelerate_ref moves it.
        model.to(f"{family}:{device}" if family is not None and isinstance(device, int) else device)
    model.hf_device_map = dict(device_map)
    return model


def _dispatch_with_hooks(
    model: nn.Module,
    device_map: DeviceMap,
    main_device: Optional[Device],
    state_dict: Optional[dict[str, torch.Tensor]],
    offload_dir: Optional[Union[str, os.PathLike]],
    offload_index: Optional[dict],
    offload_buffers: bool,
    skip_keys: Optional[Union[str, list[str]]],
    preload_module_classes: Optional[list[str]],
) -> None:
    """The hooks of a map over several devices (or with disk entries); see `dispatch_model`."""
    devices = set(device_map.values())
    if main_device is None:
        accelerators = devices - {"cpu", "disk"}
        main_device = list(accelerators)[0] if accelerators else "cpu"
    if main_device != "cpu":
        cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
        if state_dict is None and len(cpu_modules) > 0:
            state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
    disk_modules = [name for name, device in device_map.items() if device == "disk"]
    if offload_dir is None and offload_index is None and len(disk_modules) > 0:
        raise ValueError(
            "We need an `offload_dir` to dispatch this model according to this `device_map`, the following submodules "
            f"need to be offloaded: {', '.join(disk_modules)}."
        )
    if disk_modules and offload_index is None and (
        not os.path.isdir(offload_dir) or not os.path.isfile(os.path.join(offload_dir, INDEX_NAME))
    ):
        offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), disk_modules))
    execution_device = {name: main_device if device in ("cpu", "disk") else device for name, device in device_map.items()}
    execution_device[""] = main_device
    offloaded_devices = ["disk"] if main_device in ("cpu", "mps") else ["cpu", "disk"]
    offload = {name: device in offloaded_devices for name, device in device_map.items()}
    save_folder = offload_dir if len(disk_modules) > 0 else None
    weights_map = None
    if state_dict is not None or save_folder is not None or offload_index is not None:
        weights_map = OffloadedWeightsLoader(state_dict=state_dict, save_folder=save_folder, index=offload_index,
                                             device=main_device if offload_index is not None else None)
    tied_params = find_tied_parameters(model)
    tied_params_map: dict = {}
    for group in tied_params:
        for param_name in group:
            weight = recursive_getattr(model, param_name)
            if weight.device.type != "meta":
                tied_params_map[weight.data_ptr()] = {}
    attach_align_device_hook_on_blocks(
        model, execution_device=execution_device, offload=offload, offload_buffers=offload_buffers,
        weights_map=weights_map, skip_keys=skip_keys, preload_module_classes=preload_module_classes,
        tied_params_map=tied_params_map,
    )
    offloaded = " and ".join([device for device in set(device_map.values()) if device in ("cpu", "disk")])
    if len(offloaded) > 0:
        logger.warning(f"Some parameters are on the meta device because they were offloaded to the {offloaded}.")
    retie_parameters(model, tied_params)
    model.to = _guarded_move(model.to, model)
    family = next((name for name, available in _FAMILIES if available()), "cuda")
    setattr(model, family, _guarded_move(getattr(model, family), model))
    several = len([device for device in set(device_map.values()) if device not in ("cpu", "disk")]) > 1
    if several and not check_cuda_p2p_ib_support():
        logger.warning(
            "We've detected an older driver with an RTX 4000 series GPU. These drivers have issues with P2P. "
            "This can affect the multi-gpu inference when using accelerate device_map."
            "Please make sure to update your driver to the latest version which resolves this."
        )


def _guarded_move(move: Callable, model: nn.Module) -> Callable:
    """``move`` (a dispatched model's ``to`` or ``cuda``) logging HF's warning when it would move the model (a
    ``to`` with only a dtype does not), and refusing while some weights are offloaded (on ``meta``)."""

    @wraps(move)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warning = "You shouldn't move a model that is dispatched using accelerate hooks."
        if str(move.__name__) != "to" or torch._C._nn._parse_to(*args, **kwargs)[0] is not None:
            logger.warning(warning)
        for param in model.parameters():
            if param.device == torch.device("meta"):
                raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk.")
        return move(*args, **kwargs)

    return wrapper


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[Union[str, DeviceMap]] = None,
    max_memory: Optional[MaxMemory] = None,
    no_split_module_classes: Optional[list[str]] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    offload_buffers: bool = False,
    dtype: Union[str, torch.dtype, None] = None,
    offload_state_dict: Optional[bool] = None,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (usually built under `init_empty_weights`) and dispatch it.

    Rules: ``device_map`` is a map, or a strategy: ``"sequential"`` fills
    devices in order (`infer_auto_device_map` on ``max_memory``); ``"auto"``
    and ``"balanced"`` first even out the accelerators' budgets
    (`get_balanced_memory`), ``"balanced_low_0"`` keeping accelerator 0
    nearly empty; any other string is HF's ValueError naming the choices.
    With disk entries the CPU weights are staged on disk while loading
    (``offload_state_dict``) unless told otherwise. Without a map the model
    is loaded and returned undispatched.
    Catalog: bigmodel.load_checkpoint_and_dispatch.
    """
    if isinstance(device_map, str) and device_map not in DEVICE_MAP_STRATEGIES:
        raise ValueError(
            "If passing a string for `device_map`, please choose 'auto', 'balanced', 'balanced_low_0' or 'sequential'."
        )
    if isinstance(device_map, str):
        if device_map != "sequential":
            max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                             dtype=dtype, low_zero=(device_map == "balanced_low_0"))
        device_map = infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split_module_classes,
                                           dtype=dtype, offload_buffers=offload_buffers)
    if offload_state_dict is None and device_map is not None and "disk" in device_map.values():
        offload_state_dict = True
    load_checkpoint_in_model(
        model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
        offload_state_dict=offload_state_dict, offload_buffers=offload_buffers, strict=strict,
        full_state_dict=full_state_dict, broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model, device_map=device_map, offload_dir=offload_folder, offload_buffers=offload_buffers, skip_keys=skip_keys,
        preload_module_classes=preload_module_classes, force_hooks=force_hooks,
    )


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: Optional[Union[str, tuple[str, ...]]] = None,
    skip_modules_classes: Optional[tuple[type[nn.Module], ...]] = None,
    non_blocking: bool = False,
) -> None:
    """Store the weights of ``module``'s layers in ``storage_dtype``, upcast to ``compute_dtype`` per forward.

    Rule (HF 1.15's): walking the tree depth first by qualified name, a
    submodule whose name matches a ``skip_modules_pattern`` regex (searched,
    not anchored; a string is taken character by character, as HF does) or
    whose class is in ``skip_modules_classes`` is left alone with its
    children; a layer of `SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING` gets a
    `LayerwiseCastingHook` appended to its hooks; other modules are walked
    into. ``module`` itself is the first node, with the name "". Each
    decision is logged at DEBUG.
    """
    _attach_layerwise_casting_hooks(module, storage_dtype, compute_dtype, skip_modules_pattern, skip_modules_classes,
                                    non_blocking)


def _attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: Optional[Union[str, tuple[str, ...]]],
    skip_modules_classes: Optional[tuple[type[nn.Module], ...]],
    non_blocking: bool,
    prefix: str = "",
) -> None:
    skipped = (skip_modules_classes is not None and isinstance(module, skip_modules_classes)) or (
        skip_modules_pattern is not None and any(re.search(pattern, prefix) for pattern in skip_modules_pattern)
    )
    if skipped:
        logger.debug(f'Skipping layerwise casting for layer "{prefix}"')
        return
    if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
        logger.debug(f'Applying layerwise casting to layer "{prefix}"')
        add_hook_to_module(module, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
        return
    for name, child in module.named_children():
        _attach_layerwise_casting_hooks(child, storage_dtype, compute_dtype, skip_modules_pattern, skip_modules_classes,
                                        non_blocking, f"{prefix}.{name}" if prefix else name)
