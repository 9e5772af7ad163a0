"""Probes of ``ParallelismConfig`` over every combination of sizes whose product is 1 to 8 ranks: what the constructor
accepts and refuses (with its message), the sizes and dimension names of what it accepts, and the device mesh torch
builds from it at every rank of a world of that size.

Rules:

* a combination is a tuple of the five sizes (dp_replicate, dp_shard, tp, cp, sp) whose product is 1..8: 96 of
  them, each tried as constructor arguments and as ``PARALLELISM_CONFIG_*_SIZE`` variables;
* the meshes are built on torch's ``fake`` process-group backend, in this process, one world size and rank at a
  time: which ranks share each mesh dimension (the flattened ``dp``, ``dp_shard_cp`` and ``dp_cp`` included)
  depends on the world size and the rank alone, not on the transport, so worlds of 3..8 ranks need no rank pool;
* a configuration is also built on worlds of other sizes 1..8: what torch makes of the sizes it is handed.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings
from typing import Any, Iterator

import torch.distributed as dist

from ..probe import Api, probe

AREA = "parallelism_config"
#: The five dimensions, in the constructor's order.
DIMENSIONS = ("dp_replicate", "dp_shard", "tp", "cp", "sp")
#: Largest world the combinations fill.
MAX_WORLD = 8
#: What a mesh offers beyond its own dimensions: the joint dimensions `build_device_mesh` flattens.
FLATTENED = ("dp", "dp_shard_cp", "dp_cp")
#: Properties recorded for each accepted combination.
PROPERTIES = ("dp_dim_names", "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names",
              "active_mesh_dims", "total_size", "data_parallel_size", "non_data_parallel_size",
              "dp_replicate_enabled", "dp_shard_enabled", "tp_enabled", "cp_enabled", "sp_enabled")


def size_tuples(total: int, count: int) -> list[tuple[int, ...]]:
    """Every tuple of ``count`` positive integers whose product is ``total``, in lexicographic order."""
    if count == 1:
        return [(total,)]
    return [(first, *rest) for first in range(1, total + 1) if total % first == 0
            for rest in size_tuples(total // first, count - 1)]


#: Every (dp_replicate, dp_shard, tp, cp, sp) whose product is 1..MAX_WORLD.
COMBINATIONS = [sizes for total in range(1, MAX_WORLD + 1) for sizes in size_tuples(total, len(DIMENSIONS))]


def _label(sizes: tuple[int, ...]) -> str:
    return " ".join(f"{name}={size}" for name, size in zip(DIMENSIONS, sizes))


def _arguments(sizes: tuple[int, ...]) -> dict[str, int]:
    return {f"{name}_size": size for name, size in zip(DIMENSIONS, sizes)}


@contextlib.contextmanager
def fake_world(world_size: int, rank: int) -> Iterator[None]:
    """A default process group of torch's ``fake`` backend (no transport) as rank ``rank`` of ``world_size``; the
    process's ``sys.excepthook`` restored after (each ``init_process_group`` wraps it in a ``[rank<n>]:`` prefix)."""
    excepthook = sys.excepthook
    dist.init_process_group("fake", rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = excepthook


def describe_mesh(mesh: Any) -> Any:
    """A mesh as plain values: its names (their container type kept), the ranks' grid, this rank's coordinate, and,
    for each dimension and each flattened one, the ranks that share it with this rank and this rank's index there
    (a flattened one that is missing: the exception's type)."""
    if mesh is None:
        return None
    names = mesh.mesh_dim_names
    described: dict[str, Any] = {"device_type": mesh.device_type, "names": names, "grid": mesh.mesh.tolist(),
                                 "coordinate": mesh.get_coordinate()}
    with warnings.catch_warnings():  # torch's own deprecation of slicing a flattened dimension from the root
        warnings.simplefilter("ignore")
        for name in (*names, *FLATTENED):
            try:
                described[name] = (mesh[name].mesh.tolist(), mesh[name].get_local_rank())
            except KeyError as error:
                described[name] = type(error).__name__
    return described


@probe(AREA, timeout=120.0)
def every_combination_of_sizes(api: Api) -> None:
    """The constructor on each combination (accepted, or its refusal), and for what it accepts the sizes, the
    dimension names and `_get_mesh`."""
    for sizes in COMBINATIONS:
        label = _label(sizes)
        config = api.call(label, "ParallelismConfig", **_arguments(sizes))
        if config is not None:
            api.record(f"{label}: properties", {name: getattr(config, name) for name in PROPERTIES})
            api.observe(f"{label}: _get_mesh", config._get_mesh)


@probe(AREA, timeout=120.0)
def every_combination_from_the_environment(api: Api) -> None:
    """Each combination as ``PARALLELISM_CONFIG_<NAME>_SIZE`` variables (what ``accelerate launch
    --parallelism_config_*`` sets): the same acceptance, refusal and sizes as given as arguments."""
    for sizes in COMBINATIONS:
        os.environ.update({f"PARALLELISM_CONFIG_{name.upper()}_SIZE": str(size) for name, size in zip(DIMENSIONS, sizes)})
        config = api.call(_label(sizes), "ParallelismConfig")
        if config is not None:
            api.record(f"{_label(sizes)}: sizes", config._get_mesh())


@probe(AREA, timeout=120.0)
def device_mesh_at_every_rank(api: Api) -> None:
    """For each accepted combination, at each rank of a world of its total size: `get_device_mesh("cpu")` as
    plain values (`describe_mesh`), then `get_device_mesh()` again (the mesh built; without one, its refusal)."""
    make = api.get("ParallelismConfig")
    for sizes in COMBINATIONS:
        try:
            make(**_arguments(sizes))
        except ValueError:
            continue  # a refusal: every_combination_of_sizes compares it
        world_size = math.prod(sizes)
        for rank in range(world_size):
            config = make(**_arguments(sizes))
            with fake_world(world_size, rank):
                api.observe(f"{_label(sizes)} rank {rank}", lambda: describe_mesh(config.get_device_mesh("cpu")))
                api.observe(f"{_label(sizes)} rank {rank}: again, no device type",
                            lambda: config.get_device_mesh() is config.device_mesh)


@probe(AREA)
def device_mesh_on_a_world_of_another_size(api: Api) -> None:
    """A configuration of total size 2, 4 and 8 built at rank 0 of every other world size 1..8, as each
    implementation hands the sizes to torch: larger than the world, torch's refusal; smaller, a mesh over the first
    ranks (the Accelerator, not the configuration, compares the total with the world)."""
    make = api.get("ParallelismConfig")
    for total, sizes in ((2, {"dp_shard_size": 2}), (4, {"dp_replicate_size": 2, "dp_shard_size": 2}),
                         (8, {"dp_shard_size": 2, "tp_size": 2, "cp_size": 2})):
        for world_size in range(1, MAX_WORLD + 1):
            if world_size == total:
                continue
            config = make(**sizes)
            with fake_world(world_size, 0):
                api.observe(f"total {total} on {world_size} ranks", lambda: describe_mesh(config.get_device_mesh("cpu")))
