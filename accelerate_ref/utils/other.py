"""Taking a prepared model apart again: the wrappers `Accelerator.prepare` adds.

A prepared model may be, from the outside in: a `torch.compile` wrapper, a
distributed container (`DistributedDataParallel`, `DataParallel`, FSDP), and
the user's module, whose `forward` may be wrapped for mixed precision (the
original kept as ``_original_forward``).

Catalog: prepare.unwrap, prepare.verify_device_map, unwrap.keep_fp32_wrapper.
"""

from __future__ import annotations

import sys

import torch

# `save`, `load` and `clean_state_dict_for_safetensors` live in `serialization`; HF's path is here.
from .serialization import TORCH_SAFE_GLOBALS, clean_state_dict_for_safetensors, load, save  # noqa: F401
from .ports import get_free_port, is_port_in_use  # noqa: F401  (HF defines them here; kept light for the launcher)

#: Attribute under which a mixed-precision forward wrapper keeps the forward it wraps.
ORIGINAL_FORWARD = "_original_forward"


def is_compiled_module(module: torch.nn.Module) -> bool:
    """True when ``module`` is the wrapper `torch.compile` returns for a module.

    Nothing is compiled while `torch._dynamo` was never imported, and importing
    it only to ask costs seconds, so it is looked up, not imported.
    Catalog: prepare.unwrap.
    """
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and isinstance(module, dynamo.eval_frame.OptimizedModule)


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
    Catalog: prepare.unwrap, unwrap.keep_fp32_wrapper.
    """
    compiled = model if is_compiled_module(model) else None
    if compiled is not None:
        model = compiled._orig_mod
    containers = _distributed_containers()
    while isinstance(model, containers):
        model = model.module
    if recursive:
        model = _unwrap_sublayers(model)
    if not keep_fp32_wrapper and ORIGINAL_FORWARD in model.__dict__:
        model.forward = model.__dict__.pop(ORIGINAL_FORWARD)
    if compiled is not None and keep_torch_compile:
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

    Catalog: env.checks.
    """
    import logging
    import platform
    import re

    from packaging.version import Version

    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found and Version(found.group()) < Version(MIN_LINUX_KERNEL):
        logging.getLogger(__name__).warning(
            f"Detected kernel version {found.group()}, which is below the recommended minimum of "
            f"{MIN_LINUX_KERNEL}; this can cause the process to hang. It is recommended to upgrade the kernel "
            "to the minimum version or higher.")


def convert_bytes(size: float) -> str:
    """``size`` bytes in the largest unit under 1024 of it, rounded to 2 decimals ("1.5 KB"). Catalog: env.checks."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def get_pretty_name(obj: object) -> str:
    """``obj``'s qualified name, else its class's, else ``str(obj)``. Catalog: env.checks."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


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
    """Block until every process reaches this point (``PartialState().wait_for_everyone()``). Catalog: process.wait."""
    from ..state import PartialState

    PartialState().wait_for_everyone()
