"""Hooks around a module's ``forward``: moving inputs and weights to the device that runs it.

A hook is attached with `add_hook_to_module`, which keeps the original
``forward`` as ``module._old_forward`` and the hook as ``module._hf_hook``
(the attribute names 🤗 Accelerate uses, which libraries test for).

Catalog: hooks.add_remove, bigmodel.dispatch_model, bigmodel.cpu_offload,
bigmodel.cpu_offload_with_hook.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from .utils.imports import is_mlu_available, is_musa_available, is_npu_available
from .utils.memory import clear_device_cache
from .utils._modeling.sizes import get_non_persistent_buffers, named_module_tensors, set_module_tensor_to_device
from .utils.offload import PrefixedDataset
from .utils._operations.structures import find_device, send_to_device

Device = Union[int, str, torch.device]
#: Methods `dispatch_model` puts on a model's instance; removing its hook takes them away too.
ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")


def _compiler_disable(function: Callable) -> Callable:
    """``function`` kept out of torch.compile graphs; ``torch.compiler.disable`` is applied at the first call (so
    importing the hooks does not import dynamo), as HF does."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hasattr(wrapper, "_compiled_fn"):
            wrapper._compiled_fn = torch.compiler.disable(function)
        return wrapper._compiled_fn(*args, **kwargs)

    return wrapper


class ModelHook:
    """A hook that runs around a module's forward; the base class does nothing.

    ``pre_forward`` returns the (args, kwargs) the forward gets,
    ``post_forward`` the output the caller gets; ``no_grad`` runs the forward
    without autograd. Catalog: hooks.add_remove.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is attached; returns the module."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks in a row: pre-forwards in order, post-forwards in order. Catalog: hooks.add_remove."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    @_compiler_disable
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    @_compiler_disable
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    args, kwargs = module._hf_hook.pre_forward(module, *args, **kwargs)
    if module._hf_hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)
    else:
        output = module._old_forward(*args, **kwargs)
    return module._hf_hook.post_forward(module, output)


def _is_traced(module: nn.Module) -> bool:
    """A torch.fx ``GraphModule`` (its per-instance class ``GraphModuleImpl`` holds ``forward``)."""
    return "GraphModuleImpl" in str(type(module))


def _set_forward(module: nn.Module, forward: Callable) -> None:
    if _is_traced(module):
        module.__class__.forward = forward
    else:
        module.forward = forward


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run ``hook`` around ``module.forward``; with ``append`` after the hook already there (a `SequentialHook`).

    Rules (HF 1.15's): without ``append`` an existing hook is replaced
    (its ``detach_hook`` is not called); the original forward is kept as
    ``module._old_forward`` and the hooked one set on the instance (on the
    class of a torch.fx ``GraphModule``), named and documented as the
    original. Catalog: hooks.add_remove.
    """
    if append and getattr(module, "_hf_hook", None) is not None:
        previous = module._hf_hook
        remove_hook_from_module(module)
        hook = SequentialHook(previous, hook)
    if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward"):
        original = module._old_forward
    else:
        original = module.forward
        module._old_forward = original
    module = hook.init_hook(module)
    module._hf_hook = hook
    _set_forward(module, functools.update_wrapper(functools.partial(_hooked_forward, module), original))
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and, with ``recurse``, of every submodule) and restore its forward.

    Rules (HF 1.15's): the original forward is set back on the instance
    (on the class of a torch.fx ``GraphModule``); the methods `dispatch_model`
    added to the instance (`ADDED_ATTRIBUTES`) are removed too.
    Catalog: hooks.add_remove.
    """
    if hasattr(module, "_hf_hook"):
        module._hf_hook.detach_hook(module)
        delattr(module, "_hf_hook")
    if hasattr(module, "_old_forward"):
        _set_forward(module, module._old_forward)
        delattr(module, "_old_forward")
    for attribute in ADDED_ATTRIBUTES:
        module.__dict__.pop(attribute, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


class LayerwiseCastingHook(ModelHook):
    """Keep a layer's weights in ``storage_dtype`` and run its forward in ``compute_dtype``.

    Rule: attached, the layer is cast to the storage dtype; before each
    forward it is cast up to the compute dtype and after it back down, so
    only the running layer holds full-precision weights. The casts are kept
    out of torch.compile graphs, as HF's are.
    """

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return module

    @_compiler_disable
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @_compiler_disable
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def _indexed(device: Device) -> Device:
    """An int execution device as the NPU/MLU/MUSA device string its tied copies are recorded under."""
    if isinstance(device, int):
        for name, available in (("npu", is_npu_available), ("mlu", is_mlu_available), ("musa", is_musa_available)):
            if available():
                return f"{name}:{device}"
    return device


class AlignDevicesHook(ModelHook):
    """Run a module on ``execution_device``: its inputs go there, and offloaded weights come there for the forward.

    With ``offload`` the module's weights live in ``weights_map`` (CPU
    tensors or an `OffloadedWeightsLoader` reading disk) and stay on
    ``meta`` between forwards; buffers too with ``offload_buffers``, else
    they sit on the execution device (non-persistent ones always do).
    ``io_same_device`` returns the output on the device of the input;
    ``place_submodules`` treats the submodules' weights as the module's own.
    ``tied_params_map`` (``{data_ptr: {device: tensor}}``, shared by the
    hooks of one model) lets tied weights be brought once per device; it is
    dropped for a ``meta`` execution device. Catalog: bigmodel.dispatch_model,
    bigmodel.cpu_offload.
    """

    def __init__(
        self,
        execution_device: Optional[Device] = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Optional[Mapping] = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: Optional[Union[str, list[str]]] = None,
        tied_params_map: Optional[dict] = None,
    ) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.input_device: Optional[torch.device] = None
        self.param_original_devices: dict = {}
        self.buffer_original_devices: dict = {}
        self.tied_params_names: set[str] = set()
        self.tied_params_map = tied_params_map

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _offloaded(self, module: nn.Module) -> list[str]:
        names = named_module_tensors(module, self.offload_buffers, self.place_submodules, remove_non_persistent=True)
        return [name for name, _ in names]

    def _to_execution_device(self, module: nn.Module, names: Any) -> None:
        for name in names:
            set_module_tensor_to_device(module, name, self.execution_device, tied_params_map=self.tied_params_map)

    def init_hook(self, module: nn.Module) -> nn.Module:
        if self.execution_device == "meta" or self.execution_device == torch.device("meta"):
            self.tied_params_map = None
        if not self.offload and self.execution_device is not None:
            self._to_execution_device(module, [n for n, _ in named_module_tensors(module, recurse=self.place_submodules)])
        elif self.offload:
            tensors = named_module_tensors(module, recurse=self.place_submodules)
            self.original_devices = {name: tensor.device for name, tensor in tensors}
            if self.weights_map is None:
                tensors = named_module_tensors(module, self.offload_buffers, self.place_submodules)
                self.weights_map = {name: tensor.to("cpu") for name, tensor in tensors}
            for name in self._offloaded(module):
                tied = self.tied_params_map is not None and _tensor(module, name).data_ptr() in self.tied_params_map
                if tied:
                    self.tied_params_names.add(name)
                set_module_tensor_to_device(module, name, "meta")
            if not self.offload_buffers and self.execution_device is not None:
                self._to_execution_device(module, [n for n, _ in module.named_buffers(recurse=self.place_submodules)])
            elif self.offload_buffers and self.execution_device is not None:
                self._to_execution_device(module, get_non_persistent_buffers(module, recurse=self.place_submodules))
        return module

    def _maybe_get_fp16_statistics(self, name: str, value: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The 8-bit statistics (``SCB``) stored with an int8 ``weight``, if the weights map has them."""
        if value is None or value.dtype != torch.int8 or "weight" not in name:
            return None
        statistics = name.replace("weight", "SCB")
        return self.weights_map[statistics] if statistics in self.weights_map else None

    @_compiler_disable
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            self.tied_pointers_to_remove: set = set()
            for name in self._offloaded(module):
                value = self.weights_map[name]
                statistics = self._maybe_get_fp16_statistics(name, value)
                if name in self.tied_params_names and value.data_ptr() not in self.tied_params_map:
                    self.tied_params_map[value.data_ptr()] = {}
                if (value is not None and self.tied_params_map is not None and value.data_ptr() in self.tied_params_map
                        and self.execution_device not in self.tied_params_map[value.data_ptr()]):
                    self.tied_pointers_to_remove.add((value.data_ptr(), self.execution_device))
                set_module_tensor_to_device(module, name, self.execution_device, value=value,
                                            fp16_statistics=statistics, tied_params_map=self.tied_params_map)
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device, skip_keys=self.skip_keys)

    @_compiler_disable
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name in self._offloaded(module):
                set_module_tensor_to_device(module, name, "meta")
                if type(module).__name__ == "Linear8bitLt":
                    module.state.SCB = None
                    module.state.CxB = None
            for pointer, device in self.tied_pointers_to_remove:
                self.tied_params_map[pointer].pop(_indexed(device), None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload:
            for name, device in self.original_devices.items():
                if device != torch.device("meta"):
                    value = self.weights_map.get(name, None)
                    statistics = self._maybe_get_fp16_statistics(name, value)
                    set_module_tensor_to_device(module, name, device, value=value, fp16_statistics=statistics)
        return module


def _tensor(module: nn.Module, dotted: str) -> torch.Tensor:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: Device,
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict] = None,
) -> None:
    """Give every submodule with weights and no hook yet an `AlignDevicesHook` that moves its inputs to ``execution_device``."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map))
    if preload_module_classes is not None and module.__class__.__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys, preload_module_classes, tied_params_map)


def attach_align_device_hook(
    module: nn.Module,
    execution_device: Optional[Device] = None,
    offload: bool = False,
    weights_map: Optional[Mapping] = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict] = None,
) -> None:
    """Attach an `AlignDevicesHook` to every submodule that holds weights of its own (the whole module, for
    ``preload_module_classes``), with its part of ``weights_map``. Catalog: bigmodel.cpu_offload.
    """
    whole = offload and preload_module_classes is not None and module.__class__.__name__ in preload_module_classes
    if any(True for _ in named_module_tensors(module)) or whole:
        prefixed = None if weights_map is None else PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        hook = AlignDevicesHook(
            execution_device,
            offload=offload,
            weights_map=prefixed,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device,
            offload,
            weights_map,
            offload_buffers,
            f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of ``module`` and of every submodule (HF's walk). Catalog: hooks.add_remove."""
    remove_hook_from_module(module)
    for child in module.children():
        remove_hook_from_submodules(child)


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: Optional[Union[Device, dict[str, Device]]] = None,
    offload: Union[bool, dict[str, bool]] = False,
    weights_map: Optional[Mapping] = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: Optional[Union[str, list[str]]] = None,
    preload_module_classes: Optional[list[str]] = None,
    tied_params_map: Optional[dict] = None,
) -> None:
    """Hooks for a device map: each block of the map runs on its execution device, offloaded blocks on demand.

    ``execution_device`` and ``offload`` are per block name (or one value
    for all). The model itself (``""``) returns outputs where its inputs
    were. Catalog: bigmodel.dispatch_model.
    """
    common = dict(skip_keys=skip_keys, tied_params_map=tied_params_map)
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(module, execution_device, True, weights_map, offload_buffers, module_name, **common)
        else:
            add_hook_to_module(module, AlignDevicesHook(execution_device, io_same_device=True, place_submodules=True, **common))
        return
    if not isinstance(execution_device, Mapping):
        execution_device = dict.fromkeys(offload, execution_device)
    if not isinstance(offload, Mapping):
        offload = dict.fromkeys(execution_device, offload)
    top = module_name == ""
    if module_name in execution_device and module_name in offload and not offload[module_name]:
        hook = AlignDevicesHook(
            execution_device[module_name], offload_buffers=offload_buffers, io_same_device=top, place_submodules=True, **common
        )
        add_hook_to_module(module, hook)
        attach_execution_device_hook(module, execution_device[module_name], **common)
    elif module_name in execution_device and module_name in offload:
        attach_align_device_hook(
            module,
            execution_device[module_name],
            True,
            weights_map,
            offload_buffers,
            module_name,
            preload_module_classes=preload_module_classes,
            **common,
        )
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(module, AlignDevicesHook(execution_device[module_name], io_same_device=top, **common))
        attach_execution_device_hook(module, execution_device[module_name], preload_module_classes=preload_module_classes, **common)
    elif top:
        add_hook_to_module(module, AlignDevicesHook(execution_device.get(""), io_same_device=True, **common))
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child,
            execution_device,
            offload,
            weights_map,
            offload_buffers,
            f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )


class CpuOffload(ModelHook):
    """Keep a whole model on the CPU, moving it to ``execution_device`` at its forward.

    ``prev_module_hook`` (a `UserCpuOffloadHook`; anything else is ignored)
    is offloaded first when it is off the CPU, so a pipeline of models holds
    one at a time on the device. A model already on the execution device
    (compared as HF does, a ``torch.device`` against the given value) runs
    with its inputs untouched.
    Catalog: bigmodel.cpu_offload_with_hook.
    """

    def __init__(self, execution_device: Optional[Device] = None, prev_module_hook: Optional["UserCpuOffloadHook"] = None) -> None:
        self.prev_module_hook = prev_module_hook
        self.execution_device = execution_device if execution_device is not None else _default_device()

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    @_compiler_disable
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None and isinstance(self.prev_module_hook, UserCpuOffloadHook):
            if next(self.prev_module_hook.model.parameters()).device != torch.device("cpu"):
                self.prev_module_hook.offload()
                clear_device_cache()
        if next(module.parameters()).device == self.execution_device:
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


def _default_device() -> torch.device:
    from .state import PartialState

    return PartialState().default_device


class UserCpuOffloadHook:
    """What `cpu_offload_with_hook` returns: ``offload()`` sends the model back to the CPU, ``remove()`` drops the hook.

    Catalog: bigmodel.cpu_offload_with_hook.
    """

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)
