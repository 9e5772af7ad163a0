"""Data-parallel gradient synchronisation: the DDP wrapper and switching its synchronisation.

`Accelerator.prepare_model` wraps models here; `Accelerator.accumulate` and
`Accelerator.no_sync` use DDP's own ``no_sync``; this module also holds the
two mechanisms torch offers no one-call API for: synchronising a backward
whose forward ran under ``no_sync``, and joining ranks that ran out of batches.

Catalog: prepare.unwrap, kwargs.ddp, no_sync.trigger_sync_in_backward, join.uneven_inputs.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Optional

import torch
from torch.distributed.algorithms.join import Join

from ..utils.dataclasses import DistributedDataParallelKwargs


def wrap_for_data_parallel(
    model: torch.nn.Module, device: torch.device, handler: Optional[DistributedDataParallelKwargs]
) -> torch.nn.Module:
    """``model`` in a ``DistributedDataParallel`` built with the handler's arguments.

    Rule: only a model with trainable parameters is wrapped (DDP has nothing
    to synchronise otherwise); on a GPU the wrapper is pinned to the
    process's device; the handler's communication hook is registered on
    the wrapper. Catalog: prepare.unwrap, kwargs.ddp, plugin.ddp_comm_hook.
    """
    if not any(parameter.requires_grad for parameter in model.parameters()):
        return model
    wrapped = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        **(handler.to_kwargs() if handler is not None else {}),
    )
    if handler is not None:
        handler.register_comm_hook(wrapped)
    return wrapped


@contextlib.contextmanager
def sync_in_next_backward(model: torch.nn.Module) -> Iterator[None]:
    """The backward pass inside the block all-reduces ``model``'s gradients.

    DDP arms its reducer in the forward pass, and not under ``no_sync``; so a
    backward of such a forward keeps gradients local. Re-arming the reducer
    (``prepare_for_backward``) with synchronisation on makes the coming
    backward reduce every bucket, local accumulations included. The reducer
    is armed without outputs, so with ``find_unused_parameters=True`` every
    parameter counts as used. A no-op for a model that is not DDP.
    Catalog: no_sync.trigger_sync_in_backward.
    """
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        yield
        return
    saved = model.require_backward_grad_sync, model.require_forward_param_sync
    model.require_backward_grad_sync = model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])
    try:
        yield
    finally:
        model.require_backward_grad_sync, model.require_forward_param_sync = saved


@contextlib.contextmanager
def join(joinables: list[Any], enable: bool, dataloaders: list[Any], even_batches: Optional[bool]) -> Iterator[None]:
    """torch's ``Join`` over ``joinables``, with prepared loaders' ``even_batches`` overridden inside.

    Rule: ``even_batches`` (when not None) is set on the batch sampler of
    every prepared map-style loader for the block and restored after;
    loaders without one (iterable datasets) keep their setting, with a
    warning. Ranks that leave the block early shadow the collectives of
    those still training (``throw_on_early_termination=False``).
    Catalog: join.uneven_inputs.
    """
    with contextlib.ExitStack() as stack:
        if even_batches is not None:
            stack.enter_context(_even_batches_overridden(dataloaders, even_batches))
        stack.enter_context(Join(joinables, enable=enable, throw_on_early_termination=False))
        yield


@contextlib.contextmanager
def _even_batches_overridden(dataloaders: list[Any], even_batches: bool) -> Iterator[None]:
    samplers = [getattr(loader, "batch_sampler", None) for loader in dataloaders]
    overridable = [sampler for sampler in samplers if hasattr(sampler, "even_batches")]
    if len(overridable) < len(dataloaders):
        warnings.warn(  # HF 1.15's words
            "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given were iterable"
        )
    saved = [sampler.even_batches for sampler in overridable]
    for sampler in overridable:
        sampler.even_batches = even_batches
    try:
        yield
    finally:
        for sampler, value in zip(overridable, saved):
            sampler.even_batches = value
