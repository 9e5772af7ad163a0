"""Collective operations on nested lists, tuples and dicts of tensors.

Each operation walks the user's structure and moves single tensors with the
backend `collectives_for` picks (so a device family plugs in there, not here).
The local structure helpers of `structures` are re-exported, so the module
offers the names of HF's `accelerate.utils.operations`.

`PartialState` is imported inside functions: `accelerate_ref.state` imports
`accelerate_ref.utils`, and a module-level import would be a cycle.

Catalog: gather.doc_example, gather.first_dim, gather.nested, gather.scalar,
gather_object.nested, gather_object.structures, reduce.doc_example,
reduce.mean, reduce.none, reduce.nested, pad.doc_example,
pad.pad_first_index_dim, broadcast.from_process,
broadcast_object_list.in_place, debug.shape_mismatch.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import torch

from ._operations.collectives import Collectives, collectives_for
from .constants import TORCH_DISTRIBUTED_OPERATION_TYPES  # noqa: F401  (HF's utils.operations exposes it)
from ._operations.structures import (  # noqa: F401  (HF's utils.operations offers them all)
    ConvertOutputsToFp32,
    apply_to_leaves,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    is_torch_xpu_tensor,
    listify,
    pad_input_tensors,
    recursively_apply,
    send_to_device,
    slice_tensors,
)


class DistributedOperationException(Exception):
    """A collective was called with inputs that cannot work together across processes.

    Raised on every rank (never only on some, which would leave the others
    hanging), e.g. when `ACCELERATE_DEBUG_MODE=1` finds that ranks passed
    tensors of different shapes. Catalog: debug.shape_mismatch.
    """


def _describe_leaf(leaf: Any) -> Any:
    if getattr(leaf, "is_nested", False):
        return "<nested tensor>"  # it has no single shape
    return list(leaf.shape) if isinstance(leaf, torch.Tensor) else f"<{type(leaf).__name__}>"


def _accept_any(leaf: Any) -> bool:
    return True


def _collectives() -> Collectives:
    """The collectives of the current world (`PartialState`'s)."""
    from ..state import PartialState

    return collectives_for(PartialState())


def _verify(data: Any, operation: str, state: Any, collectives: Collectives) -> None:
    """Debug mode's check before a collective (HF 1.15's texts), raising DistributedOperationException.

    Rule: the input's tensors must be on the state's device type (checked on
    each rank), then every rank's input must have the same shapes (checked by
    exchanging them, so every rank raises together, naming each rank's
    shapes). `operation` is the collective's qualified name. Catalog:
    debug.shape_mismatch.
    """
    device = find_device(data)
    if device is not None and device.type != state.device.type:
        expected = state.device.type
        raise DistributedOperationException(
            f"One or more of the tensors passed to {operation} were not on the {device.type} while the "
            f"`Accelerator` is configured for {expected}. Please move it to the {expected} before calling {operation}."
        )
    described = recursively_apply(_describe_leaf, data, test_type=_accept_any)
    everyone = collectives.all_gather_object(described)
    if any(description != everyone[0] for description in everyone):
        per_rank = "\n  - ".join(f"Process {rank}: {description}" for rank, description in enumerate(everyone))
        raise DistributedOperationException(
            "Cannot apply desired operation due to shape mismatches. All shapes across devices must be valid."
            f"\n\nOperation: `{operation}`\nInput shapes:\n  - {per_rank}"
        )


def verify_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a collective so that, in debug mode, ranks with mismatched inputs fail on every rank.

    Rule (HF 1.15): outside debug mode (`PartialState().debug`) or without
    several processes the call goes straight through; otherwise the input (the
    `tensor` keyword, else the first argument) must be on the state's device
    type, and every rank's input shapes must match, else every rank raises
    DistributedOperationException naming the operation. Catalog: debug.shape_mismatch.
    """
    from ..state import PartialState

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        state = PartialState()
        if not (state.debug and state.use_distributed):
            return function(*args, **kwargs)
        tensor = kwargs["tensor"] if "tensor" in kwargs else args[0]
        _verify(tensor, f"{function.__module__}.{function.__name__}", state, collectives_for(state))
        return function(*args, **kwargs)

    return wrapper


def chained_operation(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a function so a DistributedOperationException from within is re-raised naming it.

    Rule (HF 1.15): the new exception says "Error found while calling
    `<module>.<name>`" and chains the original as its cause.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except DistributedOperationException as error:
            operation = f"{function.__module__}.{function.__name__}"
            raise DistributedOperationException(
                f"Error found while calling `{operation}`. Please see the earlier error for more details."
            ) from error

    return wrapper


def _at_least_1d(leaf: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor as a 1-d tensor of one element (catalog gather.scalar); others as they are."""
    return leaf.reshape(1) if leaf.ndim == 0 else leaf


@verify_operation
def gather(tensor: Any) -> Any:
    """Gather every tensor of a nested structure from all processes.

    Rule: each tensor becomes the concatenation along dim 0 of every rank's
    tensor, in rank order (first dim = num_processes x the input's); a 0-d
    tensor becomes a 1-d tensor of length num_processes (also with one
    process); lists/tuples/dicts are gathered leaf by leaf, structure kept.
    On one process everything else comes back as it is; on several, a
    non-tensor leaf is a TypeError naming `_gpu_gather_one` (HF 1.15's words).
    Catalog: gather.doc_example, gather.first_dim, gather.nested,
    gather.scalar, debug.shape_mismatch.
    """
    collectives = _collectives()
    if collectives.num_processes == 1:
        return recursively_apply(_at_least_1d, tensor)

    def _gpu_gather_one(leaf: torch.Tensor) -> torch.Tensor:  # HF's name: its refusal names it
        return collectives.all_gather(_at_least_1d(leaf).contiguous())

    return recursively_apply(_gpu_gather_one, tensor, error_on_other_type=True)


def gather_object(object: Any) -> list[Any]:
    """Gather a picklable object from all processes.

    Rule: a dict gives the list of every rank's dict (`{"k": r}` gives
    `[{"k": 0}, {"k": 1}]`, also `[{"k": 0}]` on one process; HF 1.15
    returns the keys, accelerate issue #2188). Anything else is returned
    as it is on one process; on several, every rank's object is iterated
    and the items concatenated in rank order (HF 1.15): `[r]` on 2 ranks
    gives `[0, 1]`, a tuple gives a list, a string its characters, and a
    non-iterable is a TypeError.
    Catalog: gather_object.nested, gather_object.structures.
    """
    collectives = _collectives()
    if isinstance(object, Mapping):
        return collectives.all_gather_object(object)
    if collectives.num_processes == 1:
        return object
    return [item for part in collectives.all_gather_object(object) for item in part]


@verify_operation
def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduce every tensor of a nested structure across all processes.

    Rule: "none" returns the input unchanged, with no communication
    (catalog reduce.none; HF 1.15 sums instead). Otherwise, on one process
    each tensor comes back as a copy, whatever the reduction; on several,
    "max" is the element-wise maximum over ranks (listed by A v1.x), any other
    name the element-wise sum, divided in place by num_processes for "mean"
    (so an integer mean is torch's RuntimeError, as in HF 1.15). `scale`
    multiplies the reduced value on XLA only, as the documents say ("only
    valid on XLA"), at every world. The utility defaults to "mean";
    `Accelerator.reduce` to "sum". Leaves are reduced one by one into new
    tensors, structure kept; a non-tensor leaf is a TypeError naming
    `_reduce_across_processes` (HF 1.15's words).
    Catalog: reduce.doc_example, reduce.mean, reduce.none, reduce.nested,
    xla.reduce_scale, debug.shape_mismatch.
    """
    from ..state import PartialState

    state = PartialState()
    if reduction == "none":
        return tensor
    collectives = collectives_for(state)
    scaled = scale != 1.0 and state.device.type == "xla"  # XLA at world 1 too, where the type is NO

    def _reduce_across_processes(leaf: torch.Tensor) -> torch.Tensor:  # HF's name: its refusal names it
        if collectives.num_processes == 1:
            result = leaf.clone()
        elif reduction == "max":
            result = collectives.all_reduce_max(leaf.contiguous())
        else:
            result = collectives.all_reduce_sum(leaf.contiguous())
            if reduction == "mean":
                result /= collectives.num_processes
        return result * scale if scaled else result

    return recursively_apply(_reduce_across_processes, tensor, error_on_other_type=True)


@verify_operation
def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Give every process the tensors of process `from_process`.

    Rule: each tensor of the nested structure is overwritten in place with
    rank `from_process`'s and returned; shapes and dtypes must agree across
    ranks. On one process the input comes back as it is, whatever it holds
    and whatever `from_process`; on several, a non-tensor leaf is a TypeError
    naming `_gpu_broadcast_one` and a `from_process` that is no rank is the
    backend's error (HF 1.15).
    Catalog: broadcast.from_process, debug.shape_mismatch.
    """
    collectives = _collectives()
    if collectives.num_processes == 1:
        return tensor

    def _gpu_broadcast_one(leaf: torch.Tensor) -> torch.Tensor:  # HF's name: its refusal names it
        buffer = leaf.contiguous()
        collectives.broadcast(buffer, from_process)
        if buffer is not leaf:
            leaf.copy_(buffer)
        return leaf

    return recursively_apply(_gpu_broadcast_one, tensor, error_on_other_type=True)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the items of `object_list` in place with those of process `from_process`.

    Rule: the list is modified in place and returned; it must have the same
    length on every rank; a `from_process` that is no rank is the backend's
    error on several processes and ignored on one (HF 1.15).
    Catalog: broadcast_object_list.in_place.
    """
    collectives = _collectives()
    if collectives.num_processes > 1:
        collectives.broadcast_object_list(object_list, from_process)
    return object_list


class CannotPadNestedTensorWarning(UserWarning):
    """Warned when `pad_across_processes` meets a nested tensor, which it leaves as it is."""


@chained_operation
def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad every tensor of a nested structure to the largest size any process has on `dim`.

    Rule: each tensor is padded on `dim` (negative counts from the end) with
    `pad_index`, at the end, or at the start with `pad_first`; a tensor
    already at the largest size is returned as it is, and so is one with no
    dimension `dim` (e.g. 0-d), and a nested tensor (with a
    `CannotPadNestedTensorWarning`). The padded tensor is
    `new_zeros(...) + pad_index`, so its dtype is the one torch promotes to
    (a bool tensor pads to int64, an int tensor with a float `pad_index` to
    float), as in HF 1.15. Lists/tuples/dicts are padded leaf by leaf; a
    non-tensor leaf is a TypeError naming `_pad_across_processes` (HF's
    words). Rank r holding `arange(r + 1)` on 2
    ranks gives shape [2] everywhere. Each leaf's shape travels by `gather`,
    so in debug mode leaves whose number of dimensions differs across ranks
    raise DistributedOperationException, re-raised naming
    `pad_across_processes` (HF 1.15).
    Catalog: pad.doc_example, pad.pad_first_index_dim, debug.shape_mismatch.
    """
    def _pad_across_processes(leaf: torch.Tensor) -> torch.Tensor:  # HF's name: its refusal names it
        if getattr(leaf, "is_nested", False):
            warnings.warn("Cannot pad nested tensors without more information. Leaving unprocessed.",
                          CannotPadNestedTensorWarning)
            return leaf
        if not -leaf.ndim <= dim < leaf.ndim:
            return leaf
        axis = dim % leaf.ndim
        size = leaf.shape[axis]
        largest = int(gather(torch.tensor(leaf.shape, device=leaf.device)[None])[:, axis].max())
        if largest == size:
            return leaf
        shape = list(leaf.shape)
        shape[axis] = largest
        padded = leaf.new_zeros(shape) + pad_index
        padded.narrow(axis, largest - size if pad_first else 0, size).copy_(leaf)
        return padded

    return recursively_apply(_pad_across_processes, tensor, error_on_other_type=True)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor that exactly one process holds, on every process (the others pass ``None``).

    Rule: unlike `broadcast`, the receiving processes need not know the shape or
    dtype: those travel first, then the holder's values reach every process (a sum
    of the holder's tensor with zeros elsewhere, as HF does). No holder, or more
    than one, is a ValueError naming how many held one.
    Catalog: broadcast.from_process (its shape-free variant).
    """
    from ..state import PartialState

    state = PartialState()
    held = [None if tensor is None else (tuple(tensor.shape), tensor.dtype)]
    described = [d for d in (gather_object(held) if state.num_processes > 1 else held) if d is not None]
    if len(described) != 1:
        raise ValueError(
            f"copy_tensor_to_devices: exactly one process must pass a tensor (the others None), {len(described)} did")
    if tensor is None:
        shape, dtype = described[0]
        tensor = torch.zeros(shape, dtype=dtype, device=state.device)
    return reduce(tensor, reduction="sum")


#: dtype <-> the integer code `gather_tensor_shape` sends with a shape (HF 1.15's codes).
TENSOR_TYPE_TO_INT = {
    torch.float: 1,
    torch.double: 2,
    torch.half: 3,
    torch.bfloat16: 4,
    torch.uint8: 5,
    torch.int8: 6,
    torch.int16: 7,
    torch.int32: 8,
    torch.int64: 9,
    torch.bool: 10,
}
TENSOR_INT_TO_DTYPE = {code: dtype for dtype, code in TENSOR_TYPE_TO_INT.items()}

#: Room for the shape plus its dtype code that `gather_tensor_shape` reduces across processes.
_SHAPE_SLOTS = 2**20


def gather_tensor_shape(tensor: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """The shape and dtype code of the tensor only one process holds (the others pass None).

    Rule (HF 1.15): returns ``(shape, code)`` on every process: ``shape`` the
    holder's non-zero dimensions as an int tensor of shape ``(ndim, 1)``, and
    ``code`` its dtype's key in TENSOR_INT_TO_DTYPE; both reach the others
    through a sum-reduce of a zero-filled buffer.
    """
    from ..state import PartialState

    buffer = torch.zeros(_SHAPE_SLOTS, dtype=torch.int, device=PartialState().device)
    if tensor is not None:
        encoded = list(tensor.shape) + [TENSOR_TYPE_TO_INT[tensor.dtype]]
        buffer[: len(encoded)] = torch.tensor(encoded, dtype=torch.int)
    buffer = reduce(buffer, reduction="sum")
    filled = buffer[buffer.nonzero()]
    return filled[:-1], int(filled[-1, 0])


@contextmanager
def GatheredParameters(  # noqa: N802  (HF 1.15's name)
    params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True
) -> Iterator[None]:
    """DeepSpeed's `zero.GatheredParameters` under ZeRO-3 init, a no-op context otherwise.

    Rule (HF 1.15): the parameters are gathered only when the state runs
    DeepSpeed and its plugin (if any) enables ZeRO-3 init (`zero3_init_flag`).
    """
    from ..state import AcceleratorState
    from .dataclasses import DistributedType

    state = AcceleratorState()
    plugin = state.deepspeed_plugin
    if state.distributed_type != DistributedType.DEEPSPEED or (plugin is not None and not plugin.zero3_init_flag):
        context = nullcontext()
    else:
        import deepspeed

        context = deepspeed.zero.GatheredParameters(
            params, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled)
    with context:
        yield


__all__ = [
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]
