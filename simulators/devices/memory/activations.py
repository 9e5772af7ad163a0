"""Which storages on the mock devices autograd holds for the backward pass: the "activations" of a peak's split.

Rules (installed by :func:`simulators.devices.memory.peaks.install` in a dry run's ranks; read by the split):

- a storage is an activation while a tensor on it is saved for backward (``ctx.save_for_backward`` and the tensors
  torch's own backward formulas save), as autograd's saved-tensor hooks see them
  (``torch.autograd.graph.saved_tensors_hooks``, one pair pushed for the process, below any the script pushes):
  from when the tensor is saved until the graph that saved it is freed (after ``backward()``, or when the output
  is dropped unused). The storage of a parameter, gradient or optimizer state stays in its own part; an activation
  is what remains saved;
- what a checkpointed region (``torch.utils.checkpoint``, Transformers' gradient checkpointing) saves is what the
  checkpoint keeps, its inputs; the tensors it recomputes in backward count while their recomputed graph holds them;
- the hooks do not change what is saved: a leaf (a parameter, an input) is saved as itself, an op's output as a
  detached tensor on the same storage, which is what autograd saves without hooks (torch/csrc/autograd/saved_variable.cpp
  keeps an output's data without its ``grad_fn``, to break the cycle the hook would otherwise close);
- ``torch.func`` transforms refuse to run while saved-tensor hooks are pushed
  (``torch._functorch.vmap.doesnt_support_saved_tensors_hooks``): inside them this pair is lifted, and what they
  save is not counted.

A storage saved twice (an output saved by its op and by the next) counts once, as every storage does.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import torch

#: The books of each mock device family in this process (``DeviceMemory``), by ``device_type``.
_BOOKS: dict[str, Any] = {}


class _Saved:
    """A saved tensor, and the mark it keeps on its storage's entry in the books while it lives."""

    __slots__ = ("tensor", "storage")

    def __init__(self, tensor: torch.Tensor, storage: Any) -> None:
        self.tensor, self.storage = tensor, storage
        if storage is not None:
            storage.saved += 1

    def __del__(self) -> None:
        if self.storage is not None:
            self.storage.saved -= 1


def _entry(tensor: torch.Tensor) -> Any:
    """The books' entry (``_Storage``) of ``tensor``'s storage when it lies on a mock device, else None."""
    with torch._C.DisableTorchFunction():  # attributes only, as the split's walk
        local = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard
        books = _BOOKS.get(getattr(local, "device_type", None)) if hasattr(local, "device_index") else None
        if books is None:
            return None
        return books.entry(local._payload, local.device_index)


def _pack(tensor: torch.Tensor) -> _Saved:
    with torch._C.DisableTorchFunction():
        output = tensor.grad_fn is not None
    return _Saved(tensor.detach() if output else tensor, _entry(tensor))


def _unpack(saved: _Saved) -> torch.Tensor:
    return saved.tensor


def _ours_on_top() -> bool:
    top = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return top is not None and top[0] is _pack


def _lifting(disable: Callable[[str], Any]) -> Callable[[str], Any]:
    """``torch.autograd.graph.disable_saved_tensors_hooks``, with this module's pair lifted while it holds."""

    @contextlib.contextmanager
    def disabling(error_message: str) -> Generator[None, None, None]:
        lifted = _ours_on_top()
        if lifted:
            torch._C._autograd._pop_saved_tensors_default_hooks()
        try:
            with disable(error_message):
                yield
        finally:
            if lifted:
                torch._C._autograd._push_saved_tensors_default_hooks(_pack, _unpack)

    return disabling


def install(books: Any) -> None:
    """Mark what autograd saves on ``books``' devices; the hooks are pushed once per process."""
    first = not _BOOKS
    _BOOKS[books.device_type] = books
    if first:
        torch.autograd.graph.disable_saved_tensors_hooks = _lifting(torch.autograd.graph.disable_saved_tensors_hooks)
        torch._C._autograd._push_saved_tensors_default_hooks(_pack, _unpack)
