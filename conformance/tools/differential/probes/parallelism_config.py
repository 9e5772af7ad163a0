"""Probes of ``accelerate.parallelism_config``: `ParallelismConfig` (its validator and every refusal, the
sizes and dimension names, ``to_json``, the device mesh at 1 and 2 ranks)."""

from __future__ import annotations

import os
from typing import Any
from unittest import mock

from ..probe import Api, probe

AREA = "parallelism_config"
PROPERTIES = ("dp_dim_names", "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names",
              "total_size", "non_data_parallel_size", "data_parallel_size", "dp_replicate_enabled",
              "dp_shard_enabled", "tp_enabled", "cp_enabled", "sp_enabled", "active_mesh_dims", "device_mesh")


def _config(api: Api, **sizes):
    return api.get("ParallelismConfig")(**sizes)


@probe(AREA)
def sizes_and_names(api: Api) -> None:
    tp_handler = api.get("utils.TorchTensorParallelConfig")
    cases = {
        "defaults": {},
        "dp_replicate 2": {"dp_replicate_size": 2},
        "dp_shard 2, cp 2": {"dp_shard_size": 2, "cp_size": 2},
        "hsdp with tp": {"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2},
        "sp 2": {"sp_size": 2},
        "a tp handler for tp 1": {"tp_handler": tp_handler()},
    }
    for label, sizes in cases.items():
        config = api.call(label, "ParallelismConfig", **sizes)
        if config is None:
            continue
        for name in PROPERTIES:
            api.observe(f"{label}: {name}", getattr, config, name)
        api.observe(f"{label}: to_json", config.to_json)
        api.observe(f"{label}: repr", repr, config)


@probe(AREA)
def refusals(api: Api) -> None:
    cases = {
        "dp_replicate 0": {"dp_replicate_size": 0},
        "dp_shard -1": {"dp_shard_size": -1},
        "tp 0": {"tp_size": 0},
        "cp 0": {"cp_size": 0},
        "sp 0": {"sp_size": 0},
        "an unknown cp backend": {"cp_backend": "ring"},
        "an unknown sp backend": {"sp_backend": "ulysses"},
        "cp and sp": {"cp_size": 2, "sp_size": 2},
        "tp with pure replication": {"tp_size": 2, "dp_replicate_size": 2},
        "cp with pure replication": {"cp_size": 2, "dp_replicate_size": 2},
        "a cp handler of another class": {"cp_size": 2, "cp_handler": object()},
        "an unknown field": {"ep_size": 2},
        "a size as a string": {"tp_size": "2"},
        "a size as a float": {"dp_shard_size": 2.0},
        "two refusals: a size and a backend": {"tp_size": 0, "cp_backend": "ring"},
        "two refusals: a cp handler and a size": {"sp_size": 0, "cp_size": 2, "cp_handler": object()},
        "two refusals: sp size and cp with sp": {"sp_size": -2, "cp_size": 2},
    }
    for label, sizes in cases.items():
        api.call(label, "ParallelismConfig", **sizes)


@probe(AREA)
def sizes_changed_after_construction(api: Api) -> None:
    """A size field assigned after construction (the enabled dimensions and total_size follow it, the sizes
    `_get_mesh` gives do not), and `_set_size`, as the Accelerator resizes dp_replicate (both follow; an unknown
    dimension refused)."""
    assigned = _config(api)
    assigned.dp_shard_size = 2
    api.observe("assigned: _get_mesh", assigned._get_mesh)
    api.observe("assigned: total_size", getattr, assigned, "total_size")
    api.observe("assigned: _sizes", getattr, assigned, "_sizes")
    api.record("attributes", sorted(vars(assigned)))
    resized = _config(api, dp_shard_size=2)
    api.observe("_set_size(tp, 2)", resized._set_size, "tp", 2)
    api.observe("after _set_size: _get_mesh", resized._get_mesh)
    api.observe("after _set_size: tp_size", getattr, resized, "tp_size")
    api.observe("_set_size of an unknown dimension", resized._set_size, "ep", 2)


@probe(AREA, env={"PARALLELISM_CONFIG_DP_SHARD_SIZE": "2", "PARALLELISM_CONFIG_TP_SIZE": "3",
                  "PARALLELISM_CONFIG_CP_BACKEND": "torch", "PARALLELISM_CONFIG_SP_SIZE": "1"})
def sizes_from_the_environment(api: Api) -> None:
    config = api.call("from the environment", "ParallelismConfig")
    api.call("an argument wins", "ParallelismConfig", dp_shard_size=1)
    if config is not None:
        api.observe("total_size", getattr, config, "total_size")
    os.environ["PARALLELISM_CONFIG_CP_SIZE"] = "x"
    api.call("a size that is not a number", "ParallelismConfig")


@probe(AREA, worlds=(1, 2))
def device_mesh(api: Api) -> None:
    api.partial_state()
    config = _config(api)
    api.observe("get_device_mesh without a device type", config.get_device_mesh)
    api.observe("no dimension enabled: build", config.build_device_mesh, "cpu")
    api.observe("no dimension enabled: get", config.get_device_mesh, "cpu")
    if api.world_size == 2:
        sharded = _config(api, dp_shard_size=2)
        mesh = api.observe("dp_shard 2", sharded.get_device_mesh, "cpu")
        if mesh is not None:
            api.observe("names", lambda: mesh.mesh_dim_names)
            api.observe("grid", lambda: mesh.mesh.tolist())
            api.observe("flattened", lambda: {name: (mesh[name].size(), mesh[name].get_local_rank())
                                              for name in ("dp", "dp_shard_cp", "dp_cp")})
            api.observe("the same mesh again", lambda: sharded.get_device_mesh() is mesh)
            api.observe("another device type", sharded.get_device_mesh, "meta")
    api.observe("sp by DeepSpeed builds none", _config(api, sp_size=2).build_device_mesh, "cpu")


#: Size combinations of HF's own mesh tests: DDP, FSDP, HSDP, FSDP+TP, HSDP+TP, TP, CP, FSDP+CP, FSDP+CP+TP, all four.
MESH_SIZES = ((8, 1, 1, 1), (1, 8, 1, 1), (2, 4, 1, 1), (1, 4, 2, 1), (2, 2, 2, 1), (1, 1, 8, 1), (1, 1, 1, 4),
              (1, 4, 1, 2), (1, 2, 2, 2), (2, 2, 2, 2))


class _RecordedMesh:
    """A stand-in for the mesh `init_device_mesh` makes: it keeps its arguments and every ``mesh[key]._flatten(name)``,
    the key as given (a list and a tuple of the same names are different observations)."""

    def __init__(self, device_type: str, mesh_shape: tuple, mesh_dim_names: tuple) -> None:
        self.built = {"device_type": device_type, "mesh_shape": mesh_shape, "mesh_dim_names": mesh_dim_names}
        self.flattened: list[tuple] = []

    def __getitem__(self, key: Any) -> Any:
        mesh = self

        class _Submesh:
            def _flatten(self, name: str) -> None:
                mesh.flattened.append((key, name))

        return _Submesh()


@probe(AREA)
def mesh_dimensions_and_flattening(api: Api) -> None:
    """What `_get_mesh` returns and what `build_device_mesh` hands torch (init_device_mesh recorded, not run), over
    the size combinations of HF's tests: the names' and keys' container types included, as HF's tests compare them."""
    import torch.distributed.device_mesh as device_mesh_module

    built: list[_RecordedMesh] = []

    def record(device_type: str, mesh_shape: tuple, *, mesh_dim_names: tuple) -> _RecordedMesh:
        built.append(_RecordedMesh(device_type, mesh_shape, mesh_dim_names))
        return built[-1]

    with mock.patch.object(device_mesh_module, "init_device_mesh", record):
        for sizes in MESH_SIZES:
            label = "dp_replicate {}, dp_shard {}, tp {}, cp {}".format(*sizes)
            config = _config(api, **dict(zip(("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size"), sizes)))
            api.observe(f"{label}: _get_mesh", config._get_mesh)
            mesh = api.observe(f"{label}: build_device_mesh", config.build_device_mesh, "cpu")
            if isinstance(mesh, _RecordedMesh):
                api.record(f"{label}: init_device_mesh", mesh.built)
                api.record(f"{label}: flattened", mesh.flattened)
