"""Taking a prepared model apart again: the wrappers `Accelerator.prepare` adds.

A prepared model may be, from the outside in: a `torch.compile` wrapper, a
distributed container (`DistributedDataParallel`, `DataParallel`, FSDP), and
the user's module, whose `forward` may be wrapped for mixed precision (the
original kept as ``_original_forward``).

Regional compilation (`compile_regions` and its in-place variants) lives here
too, as in HF: a model whose repeated blocks were compiled one by one keeps
its own class, with the uncompiled original under ``__dict__["_orig_mod"]``.

Catalog: prepare.unwrap, prepare.verify_device_map, unwrap.keep_fp32_wrapper, plugin.dynamo.
"""

from __future__ import annotations

import sys
from types import MethodType
from typing import Optional

import torch

from .constants import FSDP_PYTORCH_VERSION  # noqa: F401  (HF's utils.other exposes it)

# `save`, `load` and `clean_state_dict_for_safetensors` live in `serialization`; HF's path is here.
from ._other.serialization import TORCH_SAFE_GLOBALS, clean_state_dict_for_safetensors, load, save  # noqa: F401
from ._other.ports import get_free_port, is_port_in_use  # noqa: F401  (HF defines them here; kept light for the launcher)
from ..commands.config.default import write_basic_config  # noqa: F401  (HF's utils.other re-exports it)

#: Attribute under which a mixed-precision forward wrapper keeps the forward it wraps.
ORIGINAL_FORWARD = "_original_forward"


def is_compiled_module(module: torch.nn.Module) -> bool:
    """True when ``module`` is the wrapper `torch.compile` returns for a module.

    Nothing is compiled while `torch._dynamo` was never imported, and importing
    it only to ask costs seconds, so it is looked up, not imported.
    Catalog: prepare.unwrap.
    """
    wrapper = _optimized_module_class()
    return wrapper is not None and isinstance(module, wrapper)


def _optimized_module_class() -> type | None:
    """torch.compile's wrapper class, or None while `torch._dynamo` was never imported (nothing is compiled)."""
    dynamo = sys.modules.get("torch._dynamo")
    return None if dynamo is None else dynamo.eval_frame.OptimizedModule


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """True when ``module`` has submodules and one of them (or itself) is a `torch.compile` wrapper.

    Rule (HF's): a module without children is never "with compiled regions",
    even when compiled itself (`is_compiled_module` says that). Modules
    compiled in place (``module.compile()``) are not wrappers and do not count.
    Catalog: plugin.dynamo.
    """
    children = module._modules  # read first: a non-module is an AttributeError, as in HF
    wrapper = _optimized_module_class()
    return wrapper is not None and bool(children) and any(isinstance(sub, wrapper) for sub in module.modules())


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """True when ``module`` is a non-empty ``ModuleList`` whose items are all instances of its first item's class.

    Catalog: plugin.dynamo.
    """
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and all(isinstance(block, type(module[0])) for block in module)
    )


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """True when ``module`` or a module below it `is_repeated_blocks` (``module`` must have children).

    Catalog: plugin.dynamo.
    """
    return bool(module._modules) and any(is_repeated_blocks(sub) for sub in module.modules())


def compile_regions(module: torch.nn.Module, **compile_kwargs) -> torch.nn.Module:
    """``module`` compiled region by region: each block of a repeated ``ModuleList`` on its own.

    Rules (HF 1.15's): a repeated ``ModuleList`` becomes a new ``ModuleList``
    of ``torch.compile(block)``; a module with repeated blocks below it
    becomes a shallow copy of itself (same class, same parameters and
    buffers, its bound-method attributes rebound to the copy) whose children
    are compiled the same way, recursively; any other module is compiled
    whole. The input is left as it was; the result keeps it under
    ``__dict__["_orig_mod"]``, so `extract_model_from_parallel`
    (``keep_torch_compile=False``) gives it back. Why: blocks of one class
    reuse one compiled graph, which cuts torch.compile's cold start.
    ``compile_kwargs`` go to ``torch.compile``. Catalog: plugin.dynamo.
    """
    compiled = _compile_region(module, compile_kwargs)
    compiled.__dict__.setdefault("_orig_mod", module)
    return compiled


def _compile_region(module: torch.nn.Module, compile_kwargs: dict) -> torch.nn.Module:
    if is_repeated_blocks(module):
        return torch.nn.ModuleList(torch.compile(block, **compile_kwargs) for block in module)
    if not has_repeated_blocks(module):
        return torch.compile(module, **compile_kwargs)
    copy = type(module).__new__(type(module))
    copy.__dict__.update(module.__dict__)
    for name, value in module.__dict__.items():
        if isinstance(value, MethodType) and value.__self__ is module:  # e.g. a patched forward
            copy.__dict__[name] = MethodType(value.__func__, copy)
    copy._modules = {name: _compile_region(child, compile_kwargs) for name, child in module.named_children()}
    return copy


def compile_regions_deepspeed(module: torch.nn.Module, **compile_kwargs) -> None:
    """Regional compilation in place, for a `DeepSpeedEngine`'s ``module``: blocks call ``block.compile()``.

    Rule: the regions are those of `compile_regions`, but each is compiled
    with the in-place ``nn.Module.compile`` (no new module), so the hooks and
    offloaded parameters DeepSpeed attached stay where they are. Returns None,
    as HF's. Catalog: plugin.dynamo.
    """
    _compile_regions_in_place(module, compile_kwargs)


def compile_regions_fsdp2(module: torch.nn.Module, **compile_kwargs) -> torch.nn.Module:
    """Regional compilation in place (``block.compile()``), for a model FSDP2 shards; returns ``module``.

    Rule: as `compile_regions_deepspeed`; in place, so each module's
    ``__call__`` still runs the forward hooks FSDP2's ``fully_shard``
    registers (a `torch.compile` wrapper would call around them).
    Catalog: plugin.dynamo.
    """
    _compile_regions_in_place(module, compile_kwargs)
    return module


def _compile_regions_in_place(module: torch.nn.Module, compile_kwargs: dict) -> None:
    if is_repeated_blocks(module):
        for block in module:
            block.compile(**compile_kwargs)
    elif has_repeated_blocks(module):
        for child in module.children():
            _compile_regions_in_place(child, compile_kwargs)
    else:
        module.compile(**compile_kwargs)


def _distributed_containers() -> tuple[type, ...]:
    containers: tuple[type, ...] = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FullyShardedDataParallel

        containers += (FullyShardedDataParallel,)
    engine_module = sys.modules.get("deepspeed.runtime.engine")  # loaded only where DeepSpeed prepared a model
    if engine_module is not None:
        containers += (engine_module.DeepSpeedEngine,)
    return containers


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False
) -> torch.nn.Module:
    """The user's module inside ``model``, without the containers `prepare` added.

    Rule: distributed containers are peeled off (``.module``) until the
    user's module appears. A compiled model stays compiled (around the
    unwrapped module) unless ``keep_torch_compile=False``. With
    ``keep_fp32_wrapper=False`` the mixed-precision forward wrapper is
    removed: ``forward`` is the user's own again and returns what it
    computes, in whatever dtype. With ``recursive=True`` every submodule
    with a ``.module`` (a wrapped sublayer, as under FSDPv2 on XLA) is
    replaced by what it wraps, at every depth, as HF 1.15.
    A model compiled region by region (`compile_regions`) is unwrapped the
    same way, through the original it keeps under ``__dict__["_orig_mod"]``.
    Catalog: prepare.unwrap, unwrap.keep_fp32_wrapper, plugin.dynamo.
    """
    whole = is_compiled_module(model)
    regional = has_compiled_regions(model) and not whole and "_orig_mod" in model.__dict__
    compiled = model if whole or regional else None
    if compiled is not None:
        model = compiled.__dict__["_orig_mod"] if regional else compiled._orig_mod
    containers = _distributed_containers()
    while isinstance(model, containers):
        model = model.module
    if recursive:
        model = _unwrap_sublayers(model)
    if not keep_fp32_wrapper and ORIGINAL_FORWARD in model.__dict__:
        model.forward = model.__dict__.pop(ORIGINAL_FORWARD)
    if compiled is not None and keep_torch_compile:
        if regional:
            compiled.__dict__["_orig_mod"] = model
        else:
            compiled._orig_mod = model
        return compiled
    return model


def _unwrap_sublayers(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every wrapper (anything with a ``.module``) replaced by what it wraps, at every depth."""
    while hasattr(module, "module"):
        module = module.module
    for name, child in list(module.named_children()):
        setattr(module, name, _unwrap_sublayers(child))
    return module


def has_device_map(model: torch.nn.Module) -> bool:
    """True when ``model`` or a submodule was dispatched over several devices with a device map.

    Rule: a module carrying an ``hf_device_map`` (set by big-model loading,
    e.g. ``from_pretrained(..., device_map="auto")``) with more than one
    entry. Catalog: prepare.verify_device_map.
    """
    return any(len(getattr(module, "hf_device_map", None) or {}) > 1 for module in model.modules())


# --------------------------------------------------------------------------
# The remaining helpers of accelerate 1.15's `utils.other`: same names and parameters.
# --------------------------------------------------------------------------

#: The oldest Linux kernel HF accelerate recommends (older ones can hang distributed runs, HF issue #1929).
MIN_LINUX_KERNEL = "5.5.0"


def check_os_kernel() -> None:
    """Warn on Linux when the kernel is older than ``MIN_LINUX_KERNEL`` (it can make processes hang).

    Rule (HF 1.15's): the version is the first ``x.y.z`` of the release (a
    release without one is a ValueError, as HF's unpacking raises); the
    warning goes through `accelerate_ref.logging.get_logger` on the main
    process, so it needs an initialised state. Catalog: env.checks.
    """
    import platform
    import re

    from packaging.version import Version

    from ..logging import get_logger

    info = platform.uname()
    if info.system != "Linux":
        return
    _, version, *_ = re.split(r"(\d+\.\d+\.\d+)", info.release)
    if Version(version) < Version(MIN_LINUX_KERNEL):
        get_logger(__name__).warning(
            f"Detected kernel version {version}, which is below the recommended minimum of {MIN_LINUX_KERNEL}; "
            "this can cause the process to hang. It is recommended to upgrade the kernel to the minimum version "
            "or higher.", main_process_only=True)


def convert_bytes(size: float) -> str:
    """``size`` bytes in the largest unit under 1024 of it, rounded to 2 decimals ("1.5 KB"). Catalog: env.checks."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def get_pretty_name(obj: object) -> str:
    """``obj``'s ``__qualname__``, else its ``__name__``, looked up on its class when ``obj`` has neither; else
    ``str(obj)``. Catalog: env.checks."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    for attribute in ("__qualname__", "__name__"):
        if hasattr(obj, attribute):
            return getattr(obj, attribute)
    return str(obj)


def merge_dicts(source: dict, destination: dict) -> dict:
    """Merge ``source`` into ``destination`` recursively (nested dicts merged, other values replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: object, attr: str) -> object:
    """``getattr`` along a dotted path: ``recursive_getattr(m, "a.b")`` is ``m.a.b``."""
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list:
    """Every module of ``model``, children before parents, ``model`` last (with names if ``return_fqns``)."""
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    ordered: list[tuple[str, torch.nn.Module]] = []
    while stack:
        name, module = stack.pop()
        ordered.append((name, module))
        stack.extend((f"{name}.{child}" if name else child, sub) for child, sub in module.named_children())
    ordered.reverse()
    return ordered if return_fqns else [module for _, module in ordered]


def wait_for_everyone() -> None:
    """Block until every process reaches this point (``PartialState().wait_for_everyone()``). Catalog: sync.wait_for_everyone."""
    from ..state import PartialState

    PartialState().wait_for_everyone()


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """True when any parameter of ``model`` is a `torch.distributed.tensor.DTensor` (sharded over a device mesh).

    Rule (HF 1.15): such a model was parallelised already (tensor parallel,
    FSDP2) and cannot go into DDP.
    """
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


def get_model_tp_size(model: torch.nn.Module) -> Optional[int]:
    """The tensor-parallel degree a `transformers` model was sharded with, or None.

    Rule (HF 1.15): ``model.tp_size`` when set (transformers < 5), else the
    ``tp_size`` of ``model.config.distributed_config`` (a dict or an object;
    transformers >= 5), else None. The parameters themselves are not looked at.
    """
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return tp_size
    distributed_config = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed_config, dict):
        return distributed_config.get("tp_size")
    return getattr(distributed_config, "tp_size", None)
