"""A no-compute op's results from its arguments' metadata, each distinct call's answer kept: what a rank's CPU
spends on torch's Meta kernels, once per distinct call.

In no-compute mode (:mod:`simulators.devices.no_compute.meta_payloads`) every op on a mock tensor runs its Meta kernel on the
meta payloads, and many of torch's Meta kernels are Python (``torch._meta_registrations``, ``torch._refs``): a
Llama-3-70B-shaped rank at 64 ranks spent about a fifth of its CPU there, running the same few calls once per layer.
A Meta kernel's results are a function of what it is given:

- a meta tensor argument, of its sizes, strides, storage offset, dtype and layout (a meta tensor holds no value);
- a CPU tensor of 0 dimensions (a scalar torch moves with the op), of its dtype and value; any other CPU tensor
  makes the call one to run, not to keep;
- any other argument, of its type and value (``1``, ``1.0`` and ``True`` are equal keys of a dict, not equal
  arguments: ``int_tensor * 1`` is integral, ``int_tensor * 1.0`` is not), and of torch's default dtype (a
  factory without one).

So a call with the same metadata gets the same results (:func:`run`): new meta tensors of the kept sizes,
strides and dtype. Kept only where that is all the results are (:func:`_kept`): an op that aliases or mutates its
arguments (views, in-place and ``out=`` ops), whose output shape depends on data, or that is random is always
run; so is a call whose result shares storage, starts at an offset, or holds more storage than its sizes need
(a new tensor of the kept sizes would not be the same storage in the memory books), and a call that raised.

A foreach op (``_foreach_*``, an optimizer's step over a list of hundreds of parameters) takes each list whole, so
no two of its calls are alike, and its Meta kernel runs the elementwise one element by element: it runs on the
first of each set of equal elements only, and each other element's results are remade from its first's
(:func:`_per_distinct_element`).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

_META = torch.device("meta")
#: Tags of ops never kept: results that depend on data, and random draws.
_UNKEPT_TAGS = frozenset({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output,
                          torch.Tag.nondeterministic_seeded})
#: A call not seen before (what ``_results.get`` answers for it).
_UNSEEN = object()
#: Distinct calls -> their results' metadata (None: the call's results are not kept).
_results: dict[tuple, Any] = {}


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` on meta payloads, answered from an earlier call with the same metadata where kept
    (a foreach op: run on its distinct elements, see :func:`_per_distinct_element`)."""
    if _list_positions(func):
        return _per_distinct_element(func, args, kwargs)
    if not _keepable(func):
        return func(*args, **kwargs)
    key = _key(func, args, kwargs)
    if key is None:
        return func(*args, **kwargs)
    kept = _results.get(key, _UNSEEN)
    if kept is _UNSEEN:
        out = func(*args, **kwargs)
        _results[key] = _kept(out, args, kwargs)
        return out
    if kept is None:
        return func(*args, **kwargs)
    return _made(kept)


@functools.cache
def _keepable(func: Any) -> bool:
    """Whether ``func``'s results can be a function of its arguments' metadata: no argument or result that
    aliases or mutates, no result shaped by data, no random draw."""
    schema = func._schema
    if any(item.alias_info is not None for item in (*schema.arguments, *schema.returns)):
        return False
    return not (_UNKEPT_TAGS & set(func.tags))


@functools.cache
def _list_positions(func: Any) -> tuple[int, ...]:
    """The positions of a foreach op's list arguments (``aten::_foreach_*``); () for any other op."""
    if not func.name().startswith("aten::_foreach_"):
        return ()
    return tuple(position for position, argument in enumerate(func._schema.arguments)
                 if isinstance(argument.type, torch.ListType))


def _per_distinct_element(func: Any, args: tuple, kwargs: dict) -> Any:
    """Foreach op ``func`` run on the first of each set of equal elements (each list's entry of the same metadata,
    or the same number), the others' results remade from their first's: element i of a foreach op's result is made
    from element i of each list alone, and an in-place one returns nothing (its Meta kernel checks each distinct
    element). Run whole where a list is given by keyword, where the lists differ in length, or where a result
    could not be remade (:func:`_template`)."""
    lists = [position for position in _list_positions(func) if position < len(args) and isinstance(args[position], (list, tuple))]
    lengths = {len(args[position]) for position in lists}
    if len(lengths) != 1 or any(isinstance(value, (list, tuple)) for value in kwargs.values()):
        return func(*args, **kwargs)
    first_of: dict[tuple, int] = {}
    try:
        element_of = [first_of.setdefault(tuple(_describe(args[position][index]) for position in lists), len(first_of))
                      for index in range(lengths.pop())]
    except (_Unkeyable, TypeError):
        return func(*args, **kwargs)
    if len(first_of) == len(element_of):
        return func(*args, **kwargs)
    firsts = [element_of.index(element) for element in range(len(first_of))]
    distinct = tuple(type(arg)([arg[index] for index in firsts]) if position in lists else arg
                     for position, arg in enumerate(args))
    out = func(*distinct, **kwargs)
    if out is None:
        return None
    given = {id(value) for value in _tensors((args, kwargs))}
    try:
        templates = [_template(result, given) for result in out] if isinstance(out, list) and len(out) == len(firsts) else None
    except _Unkeyable:
        templates = None
    if templates is None:
        return func(*args, **kwargs)
    return [out[element] if firsts[element] == index else _made(templates[element]) for index, element in enumerate(element_of)]


def _key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The call's metadata (see the module docstring); None where an argument makes it a call to run."""
    try:
        key = (func, torch.get_default_dtype(), _describe(args), _describe(tuple(sorted(kwargs.items()))))
        hash(key)
    except (_Unkeyable, TypeError):
        return None
    return key


class _Unkeyable(Exception):
    """An argument whose metadata does not determine a Meta kernel's results."""


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device == _META:
            return (torch.Tensor, tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.layout)
        if value.dim() == 0 and value.layout == torch.strided:
            return (torch.Tensor, value.device.type, value.dtype, value.item())
        raise _Unkeyable
    if isinstance(value, (tuple, list)):
        return (type(value), *(_describe(item) for item in value))
    return (type(value), value)


def _kept(out: Any, args: tuple, kwargs: dict) -> Any:
    """The metadata ``out`` is remade from (:func:`_made`), or None where a remade result would differ from it."""
    given = {id(value) for value in _tensors((args, kwargs))}
    try:
        return _template(out, given)
    except _Unkeyable:
        return None


def _template(value: Any, given: set[int]) -> Any:
    if isinstance(value, torch.Tensor):
        if (id(value) in given or value.device != _META or value.layout != torch.strided or value.storage_offset()
                or value.requires_grad
                or value.untyped_storage().nbytes() != _storage_bytes(value.shape, value.stride(), value.dtype)):
            raise _Unkeyable
        return _TensorTemplate(tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, (tuple, list)):  # a tuple, a list, or one of torch.return_types
        return type(value)([_template(item, given) for item in value])
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise _Unkeyable


class _TensorTemplate(NamedTuple):
    """A result tensor's sizes, strides and dtype."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype


def _made(template: Any) -> Any:
    if isinstance(template, _TensorTemplate):
        shape, stride, dtype = template
        return torch.empty_strided(shape, stride, dtype=dtype, device=_META)
    if isinstance(template, (tuple, list)):
        return type(template)([_made(item) for item in template])
    return template


def _storage_bytes(shape: tuple, stride: tuple, dtype: torch.dtype) -> int:
    """The bytes ``torch.empty_strided(shape, stride)`` holds."""
    if any(size == 0 for size in shape):
        return 0
    return (1 + sum((size - 1) * step for size, step in zip(shape, stride))) * dtype.itemsize


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in _tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    return []
