"""Batches whose samples may be plain objects (strings, ids, ...), not only tensors.

`torch.utils.data.default_collate` turns a batch of strings into a list of
strings (and a dict sample's string field into such a list): a *sample list*,
whose items are the batch's samples just as a tensor's dim 0 is. The tensor
helpers of `structures` keep such leaves whole; these helpers join, slice and
count them sample by sample, so that `DataLoaderDispatcher` can dispatch them.

Catalog: data.dispatch_batches, data.iterable_dataset (non-tensor samples).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

import torch

from .structures import find_batch_size, honor_type, is_namedtuple


def is_sample_list(data: Any) -> bool:
    """True for a non-empty list/tuple of plain objects (no tensor, list, tuple or dict among them)."""
    return (
        isinstance(data, (list, tuple))
        and not is_namedtuple(data)
        and len(data) > 0
        and not any(isinstance(item, (torch.Tensor, list, tuple, Mapping)) for item in data)
    )


def _zip_leaves(func: Callable[[list[Any]], Any], batches: Sequence[Any]) -> Any:
    """Apply `func` to the matching leaves (tensors or sample lists) of same-structured `batches`."""
    first = batches[0]
    if is_sample_list(first) or not isinstance(first, (list, tuple, Mapping)):
        return func(list(batches))
    if isinstance(first, Mapping):
        return type(first)({key: _zip_leaves(func, [batch[key] for batch in batches]) for key in first})
    return honor_type(first, (_zip_leaves(func, [batch[i] for batch in batches]) for i in range(len(first))))


def _join(leaves: list[Any]) -> Any:
    if isinstance(leaves[0], torch.Tensor):
        return torch.cat(leaves)
    if is_sample_list(leaves[0]):
        return type(leaves[0])(itertools.chain.from_iterable(leaves))
    if len(leaves) == 1:
        return leaves[0]
    raise TypeError(f"Can only concatenate tensors or lists of samples, got {type(leaves[0]).__name__}.")


def concatenate_samples(batches: Sequence[Any]) -> Any:
    """The batches joined sample-wise: tensors on dim 0, sample lists one after the other."""
    return _zip_leaves(_join, batches)


def slice_samples(
    data: Any, tensor_slice: slice, process_index: Optional[int] = None, num_processes: Optional[int] = None
) -> Any:
    """`data[tensor_slice]` of every tensor and sample list (other leaves kept); `slice_tensors`'s signature."""
    return _zip_leaves(lambda leaves: leaves[0][tensor_slice] if _is_sliceable(leaves[0]) else leaves[0], [data])


def _is_sliceable(leaf: Any) -> bool:
    return isinstance(leaf, torch.Tensor) or is_sample_list(leaf)


def count_samples(data: Any) -> int:
    """The number of samples of the first leaf (depth first): a tensor's dim 0 or a sample list's length."""
    if is_sample_list(data):
        return len(data)
    if isinstance(data, (list, tuple, Mapping)) and len(data) > 0:
        return count_samples(next(iter(data.values())) if isinstance(data, Mapping) else data[0])
    return find_batch_size(data)
