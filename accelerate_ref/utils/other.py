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
    return containers


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
) -> torch.nn.Module:
    """The user's module inside ``model``, without the containers `prepare` added.

    Rule: distributed containers are peeled off (``.module``) until the
    user's module appears. A compiled model stays compiled (around the
    unwrapped module) unless ``keep_torch_compile=False``. With
    ``keep_fp32_wrapper=False`` the mixed-precision forward wrapper is
    removed: ``forward`` is the user's own again and returns what it
    computes, in whatever dtype.
    Catalog: prepare.unwrap, unwrap.keep_fp32_wrapper.
    """
    compiled = model if is_compiled_module(model) else None
    if compiled is not None:
        model = compiled._orig_mod
    containers = _distributed_containers()
    while isinstance(model, containers):
        model = model.module
    if not keep_fp32_wrapper and ORIGINAL_FORWARD in model.__dict__:
        model.forward = model.__dict__.pop(ORIGINAL_FORWARD)
    if compiled is not None and keep_torch_compile:
        compiled._orig_mod = model
        return compiled
    return model


def has_device_map(model: torch.nn.Module) -> bool:
    """True when ``model`` or a submodule was dispatched over several devices with a device map.

    Rule: a module carrying an ``hf_device_map`` (set by big-model loading,
    e.g. ``from_pretrained(..., device_map="auto")``) with more than one
    entry. Catalog: prepare.verify_device_map.
    """
    return any(len(getattr(module, "hf_device_map", None) or {}) > 1 for module in model.modules())
