"""DTensor's sharding propagation of a foreach op in time linear in its list, as a dry run of a 70B at 64 ranks needs.

torch 2.13 propagates a foreach op over DTensors (an optimizer's ``_foreach_*`` on FSDP2 + tensor-parallel
parameters, AdamW's first step) element by element, and for each element it

- expands the element's single-mesh-dimension strategies over the whole mesh (``expand_to_full_mesh_op_strategy``),
  though the elements of a model's list take a few distinct shapes and placements (a Llama's layers repeat), and
- decides whether ``_StridedShard`` placements encode the shard order (``_propagate_use_strided_shard_flag``) by
  scanning the input specs of every element of the list again, which makes the op quadratic in its length.

Measured on rank 0 of a Llama-3-70B shape at dp_shard 2 x tp 8 (725 parameters, no compute): AdamW's first step
took 45 of the rank's 55 CPU seconds; at 64 ranks on two cores that is most of half an hour. A GPU rank pays the same
on its CPU, once per op (torch caches each op's propagation after it); the dry run's answer does not depend on it.

What changes in a rank on the mock GPUs (:func:`install`), the propagated shardings staying those of torch:

- within one op's propagation, elements whose arguments are equal (mesh, the element's schema, its strategies and
  options) get one expansion, the first, which is a deterministic function of them (the cache lives for that op
  only, so no spec it holds is shared with another op's propagation);
- the strided-shard decision is taken from one representative spec: torch's loop over the specs with a
  ``_StridedShard`` ends True when any of them has ``use_strided_shard_as_shard_order`` True, else False when there
  is any, and leaves the strategy alone when there is none, so the first spec with True (else the first with a
  ``_StridedShard``, else none) decides the same. It is chosen once per op schema.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

from simulators.devices.import_hooks import after_import

#: The package whose import ends with the modules patched here imported (patching while one of them is being
#: imported would import the others in an order torch's circular imports do not allow).
DTENSOR = "torch.distributed.tensor"

#: The expansions of the op being propagated: arguments -> strategy (None outside an op's propagation).
_expansions: list[dict | None] = [None]
#: A cache's answer for arguments it has not seen.
_UNANSWERED = object()


def install() -> None:
    """Make DTensor's foreach propagation linear in this process (see the module's docstring)."""
    after_import(DTENSOR, _patch)


def _patch(dtensor: ModuleType) -> None:
    """Wrap torch 2.13's three functions; a torch without them (older, or renamed) propagates as it does."""
    from torch.distributed.tensor import _sharding_prop as sharding_prop
    from torch.distributed.tensor._ops import utils

    names = {sharding_prop: ("_expand_single_dim_strategy_to_mesh", "_propagate_use_strided_shard_flag"),
             utils: ("expand_to_full_mesh_op_strategy",)}
    if not all(hasattr(module, name) for module, module_names in names.items() for name in module_names):
        return
    sharding_prop._expand_single_dim_strategy_to_mesh = _one_cache_per_op(sharding_prop._expand_single_dim_strategy_to_mesh)
    utils.expand_to_full_mesh_op_strategy = _once_per_distinct_arguments(utils.expand_to_full_mesh_op_strategy)
    sharding_prop._propagate_use_strided_shard_flag = _decided_by_a_representative(
        sharding_prop._propagate_use_strided_shard_flag)


def _one_cache_per_op(expand_to_mesh: Callable) -> Callable:
    """``_expand_single_dim_strategy_to_mesh`` whose strategy function runs with a cache of expansions of its own."""

    @functools.wraps(expand_to_mesh)
    def expand(*args: Any, **kwargs: Any) -> Callable:
        strategy = expand_to_mesh(*args, **kwargs)

        def with_a_cache(*call_args: Any, **call_kwargs: Any) -> Any:
            outer, _expansions[0] = _expansions[0], {}
            try:
                return strategy(*call_args, **call_kwargs)
            finally:
                _expansions[0] = outer

        return with_a_cache

    return expand


def _once_per_distinct_arguments(function: Callable) -> Callable:
    """``function`` answering equal arguments from the running op's cache (called through outside an op)."""

    @functools.wraps(function)
    def answered(*args: Any, **kwargs: Any) -> Any:
        cache = _expansions[0]
        if cache is None:
            return function(*args, **kwargs)
        key = (function, _frozen(args), _frozen(sorted(kwargs.items())))
        try:
            answer = cache.get(key, _UNANSWERED)  # the key hashed once (an element's schema holds the op's whole lists)
        except TypeError:  # an argument with symbolic sizes: no cache, as torch's own
            return function(*args, **kwargs)
        if answer is _UNANSWERED:
            answer = cache[key] = function(*args, **kwargs)
        return answer

    return answered


def _frozen(value: Any) -> Any:
    """``value`` with its lists as tuples, all the way down (hashable where its leaves are)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(item) for item in value)
    return value


def _decided_by_a_representative(propagate_flag: Callable) -> Callable:
    """``_propagate_use_strided_shard_flag`` reading one representative spec of the op's arguments."""
    from torch.distributed.tensor.placement_types import _StridedShard

    last: list[Any] = [None, None]  # the op schema, and its stand-in

    @functools.wraps(propagate_flag)
    def propagate(op_strategy: Any, op_schema: Any) -> None:
        if last[0] is not op_schema:
            strided = [spec for spec in op_schema.args_spec if any(isinstance(p, _StridedShard) for p in spec.placements)]
            deciding = next((spec for spec in strided if spec.use_strided_shard_as_shard_order), strided[0] if strided else None)
            last[0], last[1] = op_schema, _WithArgsSpec(op_schema, () if deciding is None else (deciding,))
        return propagate_flag(op_strategy, last[1])

    return propagate


class _WithArgsSpec:
    """An op schema whose ``args_spec`` is the given specs; every other attribute is the schema's."""

    def __init__(self, schema: Any, args_spec: tuple) -> None:
        self._schema, self.args_spec = schema, args_spec

    def __getattr__(self, name: str) -> Any:
        return getattr(self._schema, name)
