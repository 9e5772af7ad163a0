"""DTensor's sharding propagation of a foreach op in time linear in its list, as a dry run of a 70B at 64 ranks needs.

torch 2.13 propagates a foreach op over DTensors (an optimizer's ``_foreach_*`` on FSDP2 + tensor-parallel
parameters, AdamW's first step) element by element, and for each element it

- builds the element's schema by mapping the op's whole arguments (``tree_map_only``, which walks a scalar list
  such as AdamW's step sizes whole for every element), hashes it for a cache, prepares the element's
  single-mesh-dimension strategies and expands them over the whole mesh (``expand_to_full_mesh_op_strategy``),
  though the elements of a model's list take a few distinct shapes and placements (a Llama's layers repeat), and
- decides whether ``_StridedShard`` placements encode the shard order (``_propagate_use_strided_shard_flag``) by
  scanning the input specs of every element of the list again, which makes the op quadratic in its length;

and before that it runs the whole op on fake tensors of every element (``_propagate_tensor_meta_non_cached``) for
its outputs' metadata, in Python meta kernels, element by element.

Measured on rank 0 of a Llama-3-70B shape at dp_shard 2 x tp 8 (725 parameters, no compute): AdamW's first step
took 45 of the rank's 55 CPU seconds; at 64 ranks on two cores that is most of half an hour. A GPU rank pays the same
on its CPU, once per op (torch caches each op's propagation after it); the dry run's answer does not depend on it.

What changes in a rank on the mock GPUs (:func:`install`), the propagated shardings staying those of torch:

- an element's schema takes the element of each list argument (the top-level ``TupleStrategy`` arguments, the only
  ones torch's mapping changes) and the op's other arguments as they are; an op with a list nested deeper is left
  to torch;
- elements whose schemas and output metadata are equal get one strategy, the first's, which is a deterministic
  function of them (the elements' strategies are kept for that op only, so no spec is shared with another op's
  propagation);
- the op runs on fake tensors of its distinct elements only (equal: each list's entry has the same fake tensor, or
  the same number), and each element's output metadata is that of its first equal one: a foreach op computes each
  element from that element's entries alone;
- the strided-shard decision is taken from one representative spec: torch's loop over the specs with a
  ``_StridedShard`` ends True when any of them has ``use_strided_shard_as_shard_order`` True, else False when there
  is any, and leaves the strategy alone when there is none, so the first spec with True (else the first with a
  ``_StridedShard``, else none) decides the same. It is chosen once per op schema.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

import torch

from simulators.devices.families.import_hooks import after_import

#: The package whose import ends with the modules patched here imported (patching while one of them is being
#: imported would import the others in an order torch's circular imports do not allow).
DTENSOR = "torch.distributed.tensor"
#: The name of torch's strategy function for a foreach op's list (``_expand_single_dim_strategy_to_mesh``'s answer
#: for an op with ``TupleStrategy`` arguments and a ``_foreach_``, ``_amp_foreach_`` or ``_fused_`` name).
TORCH_FOREACH_STRATEGY = "expanded_foreach_strategy"


def install() -> None:
    """Make DTensor's foreach propagation linear in this process (see the module's docstring)."""
    after_import(DTENSOR, _patch)


def _patch(dtensor: ModuleType) -> None:
    """Wrap torch 2.13's functions; a torch without them (older, or renamed) propagates as it does."""
    from torch.distributed.tensor import _sharding_prop as sharding_prop
    from torch.distributed.tensor._ops import single_dim_strategy

    names = {sharding_prop: ("_expand_single_dim_strategy_to_mesh", "_propagate_use_strided_shard_flag"),
             single_dim_strategy: ("_resolve_foreach_elementwise_overload",),
             sharding_prop.ShardingPropagator: ("_propagate_tensor_meta_non_cached",)}
    if not all(hasattr(module, name) for module, module_names in names.items() for name in module_names):
        return
    sharding_prop._expand_single_dim_strategy_to_mesh = _once_per_distinct_element(
        sharding_prop._expand_single_dim_strategy_to_mesh, single_dim_strategy._resolve_foreach_elementwise_overload)
    sharding_prop._propagate_use_strided_shard_flag = _decided_by_a_representative(
        sharding_prop._propagate_use_strided_shard_flag)
    propagator = sharding_prop.ShardingPropagator
    propagator._propagate_tensor_meta_non_cached = _metadata_once_per_distinct_element(
        propagator._propagate_tensor_meta_non_cached)


def _once_per_distinct_element(expand_to_mesh: Callable, element_op_of: Callable) -> Callable:
    """``_expand_single_dim_strategy_to_mesh`` whose strategy for a foreach op's list is torch's element strategy,
    computed once per distinct element (``element_op_of``: the elementwise op of a foreach op, or None)."""
    from torch.distributed.tensor._op_schema import OpSchema, TupleStrategy

    @functools.wraps(expand_to_mesh)
    def expand(mesh: Any, op_schema: Any, strategy_info: Any, output_tensor_meta: Any) -> Callable:
        strategy = expand_to_mesh(mesh, op_schema, strategy_info, output_tensor_meta)
        if getattr(strategy, "__name__", None) != TORCH_FOREACH_STRATEGY or _nests_a_list(op_schema.args_schema):
            return strategy
        lists = {position for position, arg in enumerate(op_schema.args_schema) if isinstance(arg, TupleStrategy)}
        element_op = element_op_of(op_schema.op) or op_schema.op

        def element_schema(index: int) -> Any:
            return OpSchema(element_op, args_schema=tuple(arg.children[index] if position in lists else arg
                                                          for position, arg in enumerate(op_schema.args_schema)),
                            kwargs_schema=op_schema.kwargs_schema)

        def element_strategy(op: Any, schema: Any, meta: Any) -> Any:
            return expand_to_mesh(mesh, schema, strategy_info, meta)(op, schema.args_meta, schema.kwargs_meta)

        def foreach_strategy(op: Any, args_meta: Any, kwargs_meta: Any) -> Any:
            lengths = {len(op_schema.args_schema[position].children) for position in lists}
            if len(lengths) > 1:  # torch's own check (and message), run by its strategy
                return strategy(op, args_meta, kwargs_meta)
            strategies: dict[tuple, Any] = {}
            children = []
            for index in range(lengths.pop()):
                schema, meta = element_schema(index), None if output_tensor_meta is None else output_tensor_meta[index]
                try:
                    child = strategies[schema, meta]
                except KeyError:
                    child = strategies[schema, meta] = element_strategy(op, schema, meta)
                except TypeError:  # symbolic sizes: unhashable, as for torch's own cache
                    child = element_strategy(op, schema, meta)
                children.append(child)
            return TupleStrategy(children=children)

        return foreach_strategy

    return expand


def _nests_a_list(args: tuple) -> bool:
    """Whether a ``TupleStrategy`` sits inside a container argument (torch's mapping would take its element)."""
    from torch.distributed.tensor._op_schema import TupleStrategy

    def holds(value: Any) -> bool:
        if isinstance(value, TupleStrategy):
            return True
        if isinstance(value, (list, tuple)):
            return any(holds(item) for item in value)
        if isinstance(value, dict):
            return any(holds(item) for item in value.values())
        return False

    return any(holds(arg) for arg in args if not isinstance(arg, TupleStrategy))


def _metadata_once_per_distinct_element(propagate_metadata: Callable) -> Callable:
    """``ShardingPropagator._propagate_tensor_meta_non_cached`` running a foreach op on fake tensors of its distinct
    elements only, each element's output metadata that of the first equal one."""
    from torch.distributed.tensor._op_schema import OpSchema

    @functools.wraps(propagate_metadata)
    def propagate(propagator: Any, op_schema: Any) -> Any:
        elements = _distinct_elements(op_schema)
        if elements is None:
            return propagate_metadata(propagator, op_schema)
        lists, firsts, element_of = elements
        distinct = OpSchema(op_schema.op, args_schema=tuple(type(arg)(arg[index] for index in firsts) if position in lists
                                                            else arg for position, arg in enumerate(op_schema.args_schema)),
                            kwargs_schema=op_schema.kwargs_schema)
        metadata = propagate_metadata(propagator, distinct)
        if metadata is None:  # an in-place foreach op: no output
            return None
        if not isinstance(metadata, (list, tuple)) or len(metadata) != len(firsts):
            return propagate_metadata(propagator, op_schema)
        return type(metadata)(metadata[element] for element in element_of)

    return propagate


def _distinct_elements(op_schema: Any) -> tuple[set[int], list[int], list[int]] | None:
    """For a foreach op with equal elements: the positions of its list arguments, the index of each distinct element's
    first occurrence, and each element's distinct one; None for any other op (or where an element is not a tensor's
    metadata, a number or None). Equal: each list's entry has the same fake tensor (device type, sizes, strides,
    dtype) or the same number."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    op = op_schema.op
    if not op.name().startswith("aten::_foreach_") or any(isinstance(v, (list, tuple)) for v in op_schema.kwargs_schema.values()):
        return None
    lists = {position for position, (argument, arg) in enumerate(zip(op._schema.arguments, op_schema.args_schema))
             if isinstance(argument.type, torch.ListType) and isinstance(arg, (list, tuple))}
    lengths = {len(op_schema.args_schema[position]) for position in lists}
    if len(lengths) != 1:
        return None

    def entry(value: Any) -> Any:
        if isinstance(value, DTensorSpec):
            return value.mesh.device_type, value.tensor_meta
        if value is None or isinstance(value, (bool, int, float, complex)):
            return type(value), value
        raise TypeError(value)

    positions, distinct = sorted(lists), {}
    firsts: list[int] = []
    element_of: list[int] = []
    try:
        for index in range(lengths.pop()):
            key = tuple(entry(op_schema.args_schema[position][index]) for position in positions)
            if key not in distinct:
                distinct[key] = len(firsts)
                firsts.append(index)
            element_of.append(distinct[key])
    except TypeError:  # an entry of another kind, or unhashable (symbolic sizes)
        return None
    return (lists, firsts, element_of) if len(firsts) < len(element_of) else None


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
