"""FSDP2's per-parameter mesh concatenation made once per list of meshes (``simulators/devices/no_compute/mesh_concatenation.py``):
the meshes stay torch's.

Each check runs in a process of its own on torch's fake process group (4 ranks, a 2 x 2 mesh named as HF's
``dp_shard`` x ``tp``), once with torch's ``DeviceMesh._concatenate`` and once with the simulator's.
"""
from __future__ import annotations

import textwrap

import pytest

from tests.simulators.devices.probes import torch_and_simulator

pytestmark = pytest.mark.timeout(120)

PROBE = textwrap.dedent("""\
    import json, sys

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if sys.argv[1] == "simulator":
        from simulators.devices.no_compute import mesh_concatenation
        mesh_concatenation.install()
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=4)
    root = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    dp, tp = root["dp_shard"], root["tp"]

    def seen(mesh):
        return {"names": mesh.mesh_dim_names, "ranks": mesh.mesh.tolist(), "coordinate": mesh.get_coordinate(),
                "groups": list(mesh._dim_group_names), "layout": str(mesh._layout), "root": mesh._get_root_mesh() is root}

    first, again = DeviceMesh._concatenate([dp, tp]), DeviceMesh._concatenate([dp, tp])
    other_tp = DeviceMesh._concatenate([dp, root["tp"]])  # an equal tp mesh, another object
    swapped = DeviceMesh._concatenate([tp, dp])
    print(json.dumps({"meshes": {"first": seen(first), "again": seen(again), "other tp": seen(other_tp),
                                 "swapped": seen(swapped)},
                      "again is first": again is first, "other tp is first": other_tp is first, "equal": again == first}))
    dist.destroy_process_group()
    """)


@pytest.fixture(scope="module")
def concatenated():
    return torch_and_simulator(PROBE, timeout=100)


def test_each_concatenated_mesh_is_torchs(concatenated):
    for name, expected in concatenated["torch"]["meshes"].items():
        got = concatenated["simulator"]["meshes"][name]
        assert got == expected, f"the {name} concatenation: torch makes {expected}, the simulator {got}"


def test_the_same_meshes_concatenated_again_give_the_mesh_made_first(concatenated):
    assert not concatenated["torch"]["again is first"] and concatenated["torch"]["equal"], "torch makes an equal mesh"
    assert concatenated["simulator"]["again is first"], (
        "concatenating the same two mesh objects again must give the mesh made the first time")


def test_equal_meshes_of_other_objects_are_concatenated_anew(concatenated):
    assert not concatenated["simulator"]["other tp is first"], (
        "a tp mesh equal to the first but another object (mesh['tp'] makes one per call) must be concatenated anew")
