"""FSDP2 over tensor parallelism concatenates the same two device meshes once per parameter: on the mock GPUs the
mesh made the first time is given again.

torch 2.13's ``fully_shard`` of a DTensor parameter builds its mesh as ``DeviceMesh._concatenate([dp_mesh,
tp_mesh])``: the module's data-parallel mesh and the parameter's tensor-parallel one, the same two objects for every
parameter a tensor-parallel plan split. Each call builds a new ``DeviceMesh`` (its layout, its mesh tensor, this
rank's coordinates): on rank 0 of a Llama-3-70B shape at dp_shard 2 x tp 8 (723 parameters, no compute), about a
twentieth of the rank's CPU. FSDP2 already gives every parameter of a module without tensor parallelism the one
mesh object it was given, and nothing in torch changes a mesh once made.

What changes in a rank on the mock GPUs (:func:`install`): a concatenation of the same mesh objects, in the same
order, returns the mesh the first one made (the cache holds the meshes it was given, so their ids are not reused).
Equal but distinct meshes (``mesh["tp"]`` makes a new one at each call) are concatenated anew, as by torch.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Callable

from simulators.devices.families.import_hooks import after_import

#: The module defining ``DeviceMesh`` (patched once it is imported).
DEVICE_MESH = "torch.distributed.device_mesh"


def install() -> None:
    """Give the mesh made first to a concatenation of the same meshes in this process."""
    after_import(DEVICE_MESH, _patch)


def _patch(device_mesh: ModuleType) -> None:
    """Wrap torch 2.13's ``DeviceMesh._concatenate``; a torch without it (older, or without distributed) is left alone."""
    mesh_class = getattr(device_mesh, "DeviceMesh", None)
    concatenate = getattr(mesh_class, "_concatenate", None)
    if concatenate is None:
        return
    mesh_class._concatenate = staticmethod(_made_once_per_meshes(concatenate))


def _made_once_per_meshes(concatenate: Callable) -> Callable:
    """``DeviceMesh._concatenate`` answering the same list of mesh objects with the mesh it made first."""
    made: dict[tuple[int, ...], tuple[tuple, Any]] = {}

    @functools.wraps(concatenate)
    def concatenated(device_mesh_list: list) -> Any:
        key = tuple(id(mesh) for mesh in device_mesh_list)
        if key not in made:
            made[key] = (tuple(device_mesh_list), concatenate(device_mesh_list))
        return made[key][1]

    return concatenated
