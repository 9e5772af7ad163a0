"""Big-model inference: build a model without memory, load it where a device map says, run it through hooks.

Catalog: section "Big-model inference" (bigmodel.init_empty_weights,
bigmodel.dispatch_model, bigmodel.load_checkpoint_and_dispatch,
bigmodel.cpu_offload, bigmodel.cpu_offload_with_hook), and layerwise casting
(`attach_layerwise_casting_hooks`, HF 1.15's, outside the seed documents).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from collections.abc import Mapping
from typing import Iterator, Optional, Union

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
from .utils.environment import parse_flag_from_env
from .utils.modeling import (
    check_device_map,
    find_tied_parameters,
    get_balanced_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
    retie_parameters,
)
from .utils.module_sizes import MaxMemory, as_torch_device
from .utils.offload import INDEX_NAME, OffloadedWeightsLoader, extract_submodules_state_dict, offload_state_dict

Device = Union[int, str, torch.device]
DeviceMap = dict[str, Device]

#: The strategies ``load_checkpoint_and_dispatch`` accepts as ``device_map``.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@contextmanager
def init_empty_weights(include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Inside, modules create their parameters on ``meta`` (no memory); buffers too with ``include_buffers``.

    ``include_buffers`` defaults to ``ACCELERATE_INIT_INCLUDE_BUFFERS``.
    Catalog: bigmodel.init_empty_weights.
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers) as context:
        yield context


@contextmanager
def init_on_device(device: Device, include_buffers: Optional[bool] = None) -> Iterator[None]:
    """Inside, modules create their parameters on ``device`` (and buffers, with ``include_buffers``).

    With ``include_buffers`` every tensor created inside lands on ``device``
    (torch's device context). Catalog: bigmodel.init_empty_weights.
    """
    if include_buffers is None:
        include_buffers = parse_flag_from_env("ACCELERATE_INIT_INCLUDE_BUFFERS", False)
    device = as_torch_device(device)
    if include_buffers:
        with torch.device(device):
            yield
        return
    original = nn.Module.register_parameter

    def register_on_device(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is not None:
            registered = module._parameters[name]
            extra = dict(registered.__dict__)
            extra["requires_grad"] = registered.requires_grad
            module._parameters[name] = type(registered)(registered.to(device), **extra)

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

    Rules: the map is checked first (`check_device_map`). One device: the
    model moves there, no hooks (unless ``force_hooks``). Several: each
    block runs on its device and inputs follow through hooks; ``"cpu"`` and
    ``"disk"`` blocks stay offloaded (weights on ``meta``, read from the
    CPU state dict or ``offload_dir``) and run on ``main_device`` (the first
    accelerator of the map, else the CPU), brought there only for their
    forward; the output comes back where the input was. Disk blocks need
    ``offload_dir`` (a ValueError naming them); their weights are written
    there unless it already holds an ``index.json``. ``model.hf_device_map``
    records the map. Catalog: bigmodel.dispatch_model.
    """
    check_device_map(model, device_map)
    devices = set(device_map.values())
    if len(devices) == 1 and not force_hooks:
        device = next(iter(devices))
        if device == "disk":
            raise ValueError("device_map offloads the whole model to disk: use disk_offload(model, offload_dir) for that")
        model.to(as_torch_device(device))
    else:
        if main_device is None:
            accelerators = [d for d in device_map.values() if d not in ("cpu", "disk")]
            main_device = accelerators[0] if accelerators else "cpu"
        cpu_modules = [name for name, device in device_map.items() if device == "cpu"]
        if main_device != "cpu" and state_dict is None and cpu_modules:
            state_dict = extract_submodules_state_dict(model.state_dict(), cpu_modules)
        disk_modules = [name for name, device in device_map.items() if device == "disk"]
        if disk_modules and offload_dir is None and offload_index is None:
            raise ValueError(f"device_map puts {disk_modules} on 'disk': dispatch_model needs an offload_dir for them")
        if disk_modules and offload_index is None and not os.path.isfile(os.path.join(os.fspath(offload_dir), INDEX_NAME)):
            offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), disk_modules))
        execution_device = {name: main_device if device in ("cpu", "disk") else device for name, device in device_map.items()}
        execution_device[""] = main_device
        offloaded = ("disk",) if main_device in ("cpu", "mps") else ("cpu", "disk")
        offload = {name: device in offloaded for name, device in device_map.items()}
        save_folder = offload_dir if disk_modules else None
        weights_map = None
        if state_dict is not None or save_folder is not None or offload_index is not None:
            weights_map = OffloadedWeightsLoader(
                state_dict=state_dict, save_folder=save_folder, index=offload_index,
                device=main_device if offload_index is not None else None,
            )
        tied = find_tied_parameters(model)
        attach_align_device_hook_on_blocks(
            model, execution_device, offload, weights_map, offload_buffers,
            skip_keys=skip_keys, preload_module_classes=preload_module_classes,
        )
        retie_parameters(model, tied)
    model.hf_device_map = dict(device_map)
    return model


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
    nearly empty; any other string is a ValueError naming the choices. With
    disk entries the CPU weights are staged on disk while loading
    (``offload_state_dict``) unless told otherwise.
    Catalog: bigmodel.load_checkpoint_and_dispatch.
    """
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise ValueError(f"device_map={device_map!r} is no strategy: choose one of {', '.join(DEVICE_MAP_STRATEGIES)} or pass a map")
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model, max_memory, no_split_module_classes, dtype=dtype, low_zero=device_map == "balanced_low_0"
            )
        device_map = infer_auto_device_map(
            model, max_memory, no_split_module_classes, dtype=dtype, offload_buffers=offload_buffers
        )
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and "disk" in device_map.values()
    load_checkpoint_in_model(
        model, checkpoint, device_map=device_map, offload_folder=offload_folder, dtype=dtype,
        offload_state_dict=offload_state_dict, offload_buffers=offload_buffers, strict=strict,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model, device_map, offload_dir=offload_folder, offload_buffers=offload_buffers, skip_keys=skip_keys,
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

    Rule (HF 1.15's): walking the tree by qualified name, a submodule whose
    name matches a ``skip_modules_pattern`` regex (searched, not anchored) or
    whose class is in ``skip_modules_classes`` is left alone with its
    children; a layer of `SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING` gets a
    `LayerwiseCastingHook` appended to its hooks; other modules are walked
    into. ``module`` itself is the first node, with the name "".
    """
    pending = [("", module)]
    while pending:
        name, node = pending.pop()
        skipped = (skip_modules_classes is not None and isinstance(node, skip_modules_classes)) or (
            skip_modules_pattern is not None and any(re.search(pattern, name) for pattern in skip_modules_pattern)
        )
        if skipped:
            continue
        if isinstance(node, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(node, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
            continue
        pending.extend((f"{name}.{child}" if name else child, sub) for child, sub in node.named_children())
