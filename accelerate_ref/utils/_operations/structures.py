"""Walking nested lists, tuples and dicts of tensors on one process.

Everything here is local (no communication); `operations` builds the
cross-process collectives on top and re-exports these names, so that
`accelerate_ref.utils.operations.send_to_device` works as in HF accelerate.

Catalog: ops.recursively_apply, ops.send_to_device, ops.slice_tensors,
ops.concatenate, ops.listify, ops.convert_to_fp32.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping, Sequence
from functools import update_wrapper
from typing import Any, Callable, Optional, Union

import torch

from ..dataclasses import TensorInformation


def is_torch_tensor(tensor: Any) -> bool:
    """True for a `torch.Tensor` (subclasses included). Catalog: ops.recursively_apply."""
    return isinstance(tensor, torch.Tensor)


def is_torch_xpu_tensor(tensor: Any) -> bool:
    """True for a tensor on an Intel XPU. (HF 1.15's version calls `isinstance` with eight arguments and so
    always fails: DIFFERENTIAL.toml.)"""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xpu"


def is_tensor_information(tensor_info: Any) -> bool:
    """True for a `TensorInformation`. Catalog: ops.recursively_apply."""
    return isinstance(tensor_info, TensorInformation)


def is_namedtuple(data: Any) -> bool:
    """True for an instance of a `collections.namedtuple` / `typing.NamedTuple` class.

    Catalog: gather.nested (namedtuples are rebuilt field by field).
    """
    return isinstance(data, tuple) and hasattr(data, "_fields") and hasattr(data, "_asdict")


def honor_type(obj: Sequence[Any], generator: Iterable[Any]) -> Sequence[Any]:
    """Build a sequence of `obj`'s type (list, tuple or namedtuple) from `generator`.

    Rule: namedtuples are rebuilt field by field; other sequence types from
    the iterable. Catalog: gather.nested, ops.recursively_apply.
    """
    if is_namedtuple(obj):
        return type(obj)(*generator)
    return type(obj)(generator)


def apply_to_leaves(
    func: Callable[..., Any],
    data: Any,
    args: tuple[Any, ...] = (),
    kwargs: Optional[dict[str, Any]] = None,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    reject_others_in: Optional[str] = None,
) -> Any:
    """Engine of `recursively_apply`.

    `reject_others_in` names the operation to blame when a leaf fails
    `test_type` (a TypeError naming the leaf's type); None leaves such leaves
    unchanged.
    Catalog: ops.recursively_apply, gather.nested.
    """
    kwargs = kwargs or {}
    if isinstance(data, (list, tuple)):
        return honor_type(
            data,
            (
                apply_to_leaves(func, item, args, kwargs, test_type, reject_others_in)
                for item in data
            ),
        )
    if isinstance(data, Mapping):
        return type(data)(
            {
                key: apply_to_leaves(func, value, args, kwargs, test_type, reject_others_in)
                for key, value in data.items()
            }
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if reject_others_in is not None:
        raise TypeError(
            f"Unsupported types ({type(data)}) passed to `{reject_others_in}`. Only nested "
            f"list/tuple/dicts of objects that are valid for `{test_type.__name__}` should be passed."  # HF's words
        )
    return data


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply `func(leaf, *args, **kwargs)` to every leaf of `data` accepted by `test_type`.

    Rule: lists, tuples (namedtuples included) and mappings are rebuilt with
    the same type and keys; leaves `test_type` rejects are returned as they
    are, or, with `error_on_other_type=True`, raise a TypeError naming the
    leaf's type and `func` (HF 1.15's words; a `func` without a `__name__`,
    e.g. a `functools.partial`, is named by its repr, where HF's message
    fails with an AttributeError: DIFFERENTIAL.toml).
    Catalog: ops.recursively_apply.
    """
    reject_others_in = getattr(func, "__name__", repr(func)) if error_on_other_type else None
    return apply_to_leaves(func, data, args, kwargs, test_type, reject_others_in)


def send_to_device(
    tensor: Any,
    device: Union[torch.device, str, int],
    non_blocking: bool = False,
    skip_keys: Optional[Union[str, list[str]]] = None,
) -> Any:
    """Move every tensor of a nested structure to `device`.

    Rule: anything with a `.to` method (tensors, and batch objects that move
    themselves) is moved with `.to(device, non_blocking=...)` (plain
    `.to(device)` when it does not take `non_blocking`); lists, tuples and
    dicts are rebuilt; values under a key in `skip_keys` (at any depth) stay
    where they are; other leaves are returned untouched. As in HF 1.15,
    `"npu"` means `"npu:0"`, and an integer device that a `.to` refuses with
    an AssertionError (torch_npu's) is retried as `"npu:<index>"` where an NPU
    is available.
    Catalog: ops.send_to_device, data.device_placement.
    """
    if hasattr(tensor, "to"):
        device = "npu:0" if device == "npu" else device
        try:
            return _move(tensor, device, non_blocking)
        except AssertionError:
            from ..imports import is_npu_available

            if not (isinstance(device, int) and is_npu_available()):
                raise
            return _move(tensor, f"npu:{device}", non_blocking)
    if isinstance(tensor, (list, tuple)):
        return honor_type(tensor, (send_to_device(item, device, non_blocking, skip_keys) for item in tensor))
    if isinstance(tensor, Mapping):
        skipped = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys or [])
        return type(tensor)(
            {
                key: value if key in skipped else send_to_device(value, device, non_blocking, skipped)
                for key, value in tensor.items()
            }
        )
    return tensor


def _move(movable: Any, device: Any, non_blocking: bool) -> Any:
    try:
        return movable.to(device, non_blocking=non_blocking)
    except TypeError:  # a `.to` without `non_blocking`
        return movable.to(device)


def get_data_structure(data: Any) -> Any:
    """`data` with every tensor replaced by its `TensorInformation` (shape, dtype).

    Catalog: ops.recursively_apply.
    """
    return recursively_apply(lambda tensor: TensorInformation(shape=tensor.shape, dtype=tensor.dtype), data)


def get_shape(data: Any) -> Any:
    """`data` with every tensor replaced by its shape as a list of ints.

    Catalog: debug.shape_mismatch.
    """
    return recursively_apply(lambda tensor: list(tensor.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Uninitialised tensors for every `TensorInformation` of `data_structure`.

    Rule: the inverse of `get_data_structure` up to the values.
    Catalog: ops.recursively_apply.
    """
    return recursively_apply(
        lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure, test_type=is_tensor_information
    )


def find_batch_size(data: Any) -> int:
    """The size of dim 0 of the first tensor found (depth first) in `data`.

    Rule: an empty list/tuple/dict is a ValueError; a non-tensor leaf where
    the first tensor is expected is a TypeError naming its type (HF 1.15's words).
    Catalog: gather_for_metrics.doc_example.
    """
    if isinstance(data, (list, tuple, Mapping)):
        if len(data) == 0:
            raise ValueError(f"Cannot find the batch size from empty {type(data)}.")
        first = next(iter(data.values())) if isinstance(data, Mapping) else data[0]
        return find_batch_size(first)
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"Can only find the batch size of tensors but got {type(data)}.")
    return data.shape[0]


def ignorant_find_batch_size(data: Any) -> Optional[int]:
    """As `find_batch_size`, but None where it would raise. Catalog: gather_for_metrics.doc_example."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def listify(data: Any) -> Any:
    """`data` with every tensor turned into Python numbers / nested lists (`Tensor.tolist`).

    Rule: bf16 tensors go through fp32 first (NumPy has no bf16).
    Catalog: ops.listify.
    """

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        return tensor.tolist()

    return recursively_apply(to_list, data)


def find_device(data: Any) -> Optional[torch.device]:
    """The device of the first tensor found (depth first) in `data`, None without tensors.

    Catalog: ops.send_to_device.
    """
    if isinstance(data, torch.Tensor):
        return data.device
    children = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for child in children:
        device = find_device(child)
        if device is not None:
            return device
    return None


def slice_tensors(
    data: Any, tensor_slice: Any, process_index: Optional[int] = None, num_processes: Optional[int] = None
) -> Any:
    """`data` with `tensor[tensor_slice]` taken of every tensor.

    Rule: non-tensor leaves are kept. `process_index` and `num_processes`
    are accepted for signature compatibility with the documented API and
    not used (as in HF accelerate).
    Catalog: ops.slice_tensors.
    """
    return recursively_apply(lambda tensor: tensor[tensor_slice], data)


def concatenate(data: Sequence[Any], dim: int = 0) -> Any:
    """Concatenate a list of same-structured nested tensors along `dim`, leaf by leaf.

    Rule: `data[0]` gives the structure (lists, tuples, dicts); tensors are
    joined with `torch.cat`; a one-item list or tuple of a non-tensor is
    returned as that item; any other leaf is a TypeError naming its type
    (HF 1.15's words).
    Catalog: ops.concatenate.
    """
    first = data[0]
    if isinstance(first, (list, tuple)):
        return honor_type(first, (concatenate([item[i] for item in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return type(first)({key: concatenate([item[key] for item in data], dim=dim) for key in first})
    if isinstance(first, torch.Tensor):
        return torch.cat(list(data), dim=dim)
    if isinstance(data, (list, tuple)) and len(data) == 1:
        return first
    raise TypeError(f"Can only concatenate tensors but got {type(first)}")


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad every tensor on `dim` so that `batch_size` items split evenly over `num_processes`.

    Rule: the target size is the smallest multiple of `num_processes` that
    is at least `batch_size` (3 items on 4 processes: 4; 5 on 4: 8); new
    entries repeat the tensor's last entry on `dim` (as HF's docstring says;
    HF 1.15 fills zeros and can miss the multiple, e.g. 6 on 4 gives 9).
    Non-tensor leaves are a TypeError.
    Catalog: split.padding (the same padding rule for inputs).
    """
    target = -(-batch_size // num_processes) * num_processes

    def _pad_input_tensors(leaf: torch.Tensor) -> torch.Tensor:  # HF's name: its refusal names it
        size = leaf.shape[dim]
        if size >= target:
            return leaf
        if size == 0:
            raise ValueError("Cannot pad an empty tensor by repeating its last entry.")
        last = leaf.narrow(dim, size - 1, 1)
        return torch.cat([leaf, last.repeat_interleave(target - size, dim=dim)], dim=dim)

    return recursively_apply(_pad_input_tensors, tensor, error_on_other_type=True)


def _is_half_precision(value: Any) -> bool:
    return getattr(value, "dtype", None) in (torch.float16, torch.bfloat16) and hasattr(value, "float")


def convert_to_fp32(tensor: Any) -> Any:
    """`tensor` with every fp16/bf16 leaf converted to fp32 (`.float()`); others untouched.

    Catalog: ops.convert_to_fp32.
    """
    return recursively_apply(lambda half: half.float(), tensor, test_type=_is_half_precision)


class ConvertOutputsToFp32:
    """Callable wrapper of a forward function whose fp16/bf16 outputs become fp32.

    Rule: calls `model_forward` and applies `convert_to_fp32` to its result;
    pickling it is refused with an error telling to unwrap the model first
    (a prepared model under mixed precision carries this wrapper).
    Catalog: ops.convert_to_fp32.
    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> None:
        raise pickle.PicklingError(
            "Cannot pickle a prepared model with automatic mixed precision, please unwrap the model with "
            "`Accelerator.unwrap_model(model)` before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `model_forward` so that its fp16/bf16 outputs come back in fp32.

    Rule: the returned function's `__wrapped__` is the `ConvertOutputsToFp32`
    wrapper, which `unwrap_model(..., keep_fp32_wrapper=False)` removes.
    Catalog: ops.convert_to_fp32, unwrap.keep_fp32_wrapper.
    """
    converter = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return converter(*args, **kwargs)

    forward.__wrapped__ = converter  # type: ignore[attr-defined]
    return forward
