"""DTensor's foreach propagation made linear (``simulators/devices/no_compute/foreach_sharding.py``): the shardings stay torch's.

Each check runs in a process of its own on torch's fake process group (4 ranks, a 2 x 2 mesh named as HF's
``dp_shard`` x ``tp``), once with torch's propagation and once with the simulator's, and compares what the foreach
ops give: each output's placements, shape and shard order; and that the simulator's expands and runs on fake tensors
fewer elements than torch's.
"""
from __future__ import annotations

import textwrap

import pytest

from tests.simulators.devices.probes import torch_and_simulator

pytestmark = pytest.mark.timeout(180)

PROBE = textwrap.dedent("""\
    import itertools, json, sys

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor import _op_schema
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
    from torch.distributed.tensor._ops import utils
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    counts = {"expansions": 0, "fake tensors": 0}

    def counted(function, name):
        def call(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return call

    utils.expand_to_full_mesh_op_strategy = counted(utils.expand_to_full_mesh_op_strategy, "expansions")
    _op_schema._rebuild_tensor_from_dtensor_meta = counted(_op_schema._rebuild_tensor_from_dtensor_meta, "fake tensors")
    if sys.argv[1] == "simulator":
        from simulators.devices.no_compute import foreach_sharding
        foreach_sharding.install()
    import torch.distributed.tensor._sharding_prop as sharding_prop

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    STRIDED = (_StridedShard(0, split_factor=2), Shard(0))  # FSDP2's rows of a colwise tp shard
    LAYOUTS = [(STRIDED, (8, 4)), ((Shard(0), Shard(1)), (4, 8)), ((Shard(0), Replicate()), (8,)),
               ((Shard(0), Shard(0)), (16, 4))]

    def parameters(turn):
        # three "layers" of four parameters; in the middle one, turn > 0 moves the 2-D ones to another layout
        made = []
        for layer in range(3):
            for index, (placements, shape) in enumerate(LAYOUTS):
                if len(shape) == 2 and layer == 1:
                    placements = [p for p, s in LAYOUTS if len(s) == 2][(index + turn) % 3]
                if any(isinstance(p, _StridedShard) for p in placements):
                    local = torch.randn(shape[0] // 4, *shape[1:])
                    made.append(DTensor.from_local(local, mesh, placements, shape=torch.Size(shape),
                                                   stride=torch.empty(shape).stride(), run_check=False))
                else:
                    made.append(distribute_tensor(torch.randn(shape), mesh, placements))
        return made

    a, b, c = parameters(0), parameters(1), parameters(2)
    for tensor in c:  # a _StridedShard read as a plain Shard, as view propagation marks one
        if any(isinstance(p, _StridedShard) for p in tensor.placements):
            spec = tensor._spec
            tensor._spec = DTensorSpec(spec.mesh, spec.placements, spec.tensor_meta, use_strided_shard_as_shard_order=False)
    scalars = [0.5 + i for i in range(len(a))]
    outputs = {"add": torch._foreach_add(a, b), "mul": torch._foreach_mul(a, scalars), "sqrt": torch._foreach_sqrt(c)}
    torch._foreach_addcdiv_(a, b, c, scalars)
    torch._foreach_lerp_(b, c, 0.1)
    outputs["addcdiv_"], outputs["lerp_"] = a, b
    shardings = {op: [[str(t.placements), list(t.shape), t._spec.use_strided_shard_as_shard_order, str(t._spec.shard_order)]
                      for t in tensors] for op, tensors in outputs.items()}

    # the strided-shard flag: every sequence of three argument specs (no _StridedShard, one read as a plain Shard, one
    # encoding the order) against a strategy whose output and input specs hold a _StridedShard flagged either way
    propagate = sharding_prop._propagate_use_strided_shard_flag
    meta = TensorMeta(torch.Size([8, 4]), (4, 1), torch.float32)
    kinds = {"plain": ((Shard(0), Shard(1)), None), "strided-as-shard": (STRIDED, False), "strided": (STRIDED, True)}
    flags = {}
    for sequence in itertools.product(kinds, repeat=3):
        for output_flag in (False, True):
            arguments = tuple(DTensorSpec(mesh, kinds[k][0], meta, use_strided_shard_as_shard_order=kinds[k][1]) for k in sequence)
            output = DTensorSpec(mesh, STRIDED, meta, use_strided_shard_as_shard_order=output_flag)
            strategy = OpStrategy([OpSpec(output, input_specs=[DTensorSpec(mesh, STRIDED, meta, use_strided_shard_as_shard_order=output_flag)])])
            propagate(strategy, OpSchema(torch.ops.aten.add.Tensor, arguments, {}))
            spec = strategy.strategies[0]
            flags[f"{'/'.join(sequence)}, strategy {output_flag}"] = [
                [s.use_strided_shard_as_shard_order, str(s.shard_order)] for s in (spec.output_spec, *spec.input_specs)]
    print(json.dumps({"shardings": shardings, "strided flag": flags, **counts}))
    dist.destroy_process_group()
    """)


@pytest.fixture(scope="module")
def propagated():
    return torch_and_simulator(PROBE, timeout=150)


def test_foreach_ops_over_mixed_layouts_are_sharded_as_by_torch(propagated):
    torch_ops, simulator_ops = propagated["torch"]["shardings"], propagated["simulator"]["shardings"]
    for op, expected in torch_ops.items():
        for index, (got, wanted) in enumerate(zip(simulator_ops[op], expected)):
            assert got == wanted, (f"_foreach_{op.rstrip('_')} element {index}: torch propagates [placements, shape, "
                                   f"strided flag, shard order] {wanted}, the simulator's propagation {got}")


def test_each_distinct_element_is_expanded_once(propagated):
    torch_count, simulator_count = propagated["torch"]["expansions"], propagated["simulator"]["expansions"]
    assert simulator_count < torch_count, (
        f"torch expanded {torch_count} elements' strategies over the mesh, the simulator {simulator_count}: the "
        "elements of equal layout and shape in one foreach op must share one expansion")


def test_each_distinct_element_runs_on_fake_tensors_once(propagated):
    torch_count, simulator_count = propagated["torch"]["fake tensors"], propagated["simulator"]["fake tensors"]
    assert simulator_count < torch_count, (
        f"torch made {torch_count} fake tensors to find the foreach ops' output metadata, the simulator "
        f"{simulator_count}: the elements of equal sizes, strides and dtype in one foreach op must run once")


def test_the_strided_shard_flag_is_decided_as_by_torch(propagated):
    torch_flags, simulator_flags = propagated["torch"]["strided flag"], propagated["simulator"]["strided flag"]
    for case, expected in torch_flags.items():
        assert simulator_flags[case] == expected, (
            f"argument specs {case}: torch leaves the strategy's specs' [use_strided_shard_as_shard_order, shard "
            f"order] as {expected}, the simulator's representative spec as {simulator_flags[case]}")
