"""N-D parallelism (HF 1.15): `ParallelismConfig`, its handlers, `Accelerator(parallelism_config=...)`
and the data loaders' ``torch_device_mesh``, each compared with HF accelerate's on the same inputs.

Single-process tests compare the configuration's fields, properties and
refusals; one launch of 4 ranks (2 simulated machines of 2) compares the
device meshes torch builds over gloo for HF's configuration and ours, the
Accelerator's ranks, the data-parallel shares of the loaders, FSDP over the
mesh, and the DTensor checks on a tensor-parallel model. HF's Accelerator
refuses every ParallelismConfig of total size > 1 on MULTI_CPU (its
``multi_device`` leaves the CPU out), so there the documented rule is
checked directly against the mesh HF's configuration builds. With transformers
installed (4 or 5), the tp handler's version gate is compared, and one launch of
2 ranks loads a model sharded by Transformers' own tensor parallelism, which
HF's `get_model_tp_size` reads where each major version keeps the degree.
No catalog ID covers N-D parallelism yet.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

hf_parallelism = pytest.importorskip("accelerate.parallelism_config")

import accelerate.utils as hf_utils  # noqa: E402
import accelerate.utils.other as hf_other  # noqa: E402

import simulators  # noqa: E402
from accelerate_ref import Accelerator, AcceleratorState, GradientState, ParallelismConfig  # noqa: E402
from accelerate_ref.utils import TorchContextParallelConfig, TorchTensorParallelConfig, get_model_tp_size, model_has_dtensor  # noqa: E402
from accelerate_ref.utils.imports import is_transformers_available  # noqa: E402

HfConfig = hf_parallelism.ParallelismConfig

PROPERTIES = [
    "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend",
    "dp_dim_names", "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names",
    "total_size", "non_data_parallel_size", "data_parallel_size", "dp_replicate_enabled", "dp_shard_enabled",
    "tp_enabled", "cp_enabled", "sp_enabled", "active_mesh_dims", "device_mesh", "_sizes",
]

#: A handler stand-in for tp and sp: HF's default ones need transformers (an extra: these configurations must not
#: depend on it) or are another area's (DeepSpeedSequenceParallelConfig); neither configuration checks a given tp or
#: sp handler's type.
class _Handler:
    """Named in test ids (an `object()`'s address would differ between pytest-xdist workers)."""

    def __repr__(self) -> str:
        return "HANDLER"


HANDLER = _Handler()

CONFIGS = [
    {},
    {"dp_replicate_size": 4},
    {"dp_shard_size": 4},
    {"dp_replicate_size": 2, "dp_shard_size": 2},
    {"dp_shard_size": 2, "cp_size": 2},
    {"dp_replicate_size": 2, "dp_shard_size": 2, "cp_size": 2},
    {"cp_size": 4},
    {"dp_shard_size": 2, "sp_size": 2, "sp_handler": HANDLER},
    {"dp_shard_size": 2, "tp_size": 2, "tp_handler": HANDLER},
    {"dp_replicate_size": 2, "dp_shard_size": 2, "cp_size": 2, "tp_size": 2, "tp_handler": HANDLER},
]


def described(config) -> dict:
    seen = {name: getattr(config, name) for name in PROPERTIES}
    seen["mesh"] = config._get_mesh()
    seen["handlers"] = {name: type(getattr(config, f"{name}_handler")).__name__ for name in ("tp", "cp", "sp")}
    return seen


@pytest.mark.parametrize("sizes", CONFIGS, ids=[",".join(f"{k}={v}" for k, v in c.items() if k.endswith("size")) or "defaults" for c in CONFIGS])
def test_properties_match_hf(sizes):
    assert described(ParallelismConfig(**sizes)) == described(HfConfig(**sizes))


def test_sizes_and_backends_come_from_the_environment_as_hf(monkeypatch):
    for name, value in [("DP_REPLICATE_SIZE", "2"), ("DP_SHARD_SIZE", "2"), ("CP_SIZE", "2"), ("CP_COMM_STRATEGY", "alltoall")]:
        monkeypatch.setenv(f"PARALLELISM_CONFIG_{name}", value)
    ours, hf = ParallelismConfig(), HfConfig()
    assert described(ours) == described(hf) and ours.total_size == 8
    assert ours.cp_handler.cp_comm_strategy == hf.cp_handler.cp_comm_strategy == "alltoall"
    assert ParallelismConfig(cp_size=1).cp_size == 1, "an argument wins over the environment"


INVALID = [
    {"dp_replicate_size": 0},
    {"dp_shard_size": 0},
    {"tp_size": 0},
    {"cp_size": -1},
    {"sp_size": 0},
    {"cp_backend": "ring"},
    {"sp_backend": "torch"},
    {"cp_size": 2, "sp_size": 2, "sp_handler": HANDLER},
    {"dp_replicate_size": 2, "cp_size": 2},
    {"cp_size": 2, "cp_handler": "not a handler"},
]


@pytest.mark.parametrize("sizes", INVALID, ids=[str(c) for c in INVALID])
def test_invalid_configurations_are_refused_as_hf(sizes):
    with pytest.raises(ValueError) as hf_error:
        HfConfig(**sizes)
    with pytest.raises(ValueError) as ours:
        ParallelismConfig(**sizes)
    words = [word for word in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "cp_backend",
                               "sp_backend", "mutually exclusive", "pure data parallelism", "cp_handler") if word in str(hf_error.value)]
    assert words and all(word in str(ours.value) for word in words), (str(ours.value), str(hf_error.value))


def test_tensor_parallel_handler_needs_transformers_as_hf():
    if is_transformers_available():
        pytest.skip("transformers is installed: the handler is built")
    for config in (HfConfig, ParallelismConfig, hf_utils.TorchTensorParallelConfig, TorchTensorParallelConfig):
        with pytest.raises(ImportError):
            config(tp_size=2) if config in (HfConfig, ParallelismConfig) else config()


def _handler_outcomes() -> list:
    """HF's and our default tp handlers, built through a configuration and alone: the class built, or the refusal."""
    outcomes = []
    for build in (lambda: HfConfig(tp_size=2).tp_handler, lambda: ParallelismConfig(tp_size=2).tp_handler,
                  hf_utils.TorchTensorParallelConfig, TorchTensorParallelConfig):
        try:
            outcomes.append(type(build()).__name__)
        except ValueError as error:
            outcomes.append(f"ValueError: {error}")
    return outcomes


@pytest.mark.skipif(not is_transformers_available(), reason="transformers is not installed (extra transformers)")
@pytest.mark.parametrize("installed", ["as installed", "4.51.0"])
def test_tensor_parallel_handler_is_gated_on_the_transformers_version_as_hf(installed, monkeypatch):
    """HF 1.15 builds the default tp handler with transformers >= 4.52 (4.57 and 5.x alike: the extra's bound admits
    both) and refuses an older one naming the version; the installed version is read from its metadata each time."""
    expected = ["TorchTensorParallelConfig"] * 4
    if installed != "as installed":
        real_version = importlib.metadata.version
        monkeypatch.setattr(importlib.metadata, "version", lambda name: installed if name == "transformers" else real_version(name))
        expected = [f"ValueError: TP requires transformers >= {hf_utils.dataclasses.BETA_TP_AVAILABLE_TRANSFORMERS_VERSION}"] * 4
    assert _handler_outcomes() == expected
    if installed == "as installed":
        for handler in (hf_utils.TorchTensorParallelConfig, TorchTensorParallelConfig):
            with pytest.warns(UserWarning, match="Async tensor parallelism is currently not supported"):
                handler(enable_async_tp=True)


def test_context_parallel_handler_matches_hf(monkeypatch):
    assert TorchContextParallelConfig() == TorchContextParallelConfig(cp_comm_strategy="allgather")
    assert dataclasses.asdict(TorchContextParallelConfig()) == dataclasses.asdict(hf_utils.TorchContextParallelConfig())
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    assert TorchContextParallelConfig().cp_comm_strategy == hf_utils.TorchContextParallelConfig().cp_comm_strategy == "alltoall"
    for config in (hf_utils.TorchContextParallelConfig, TorchContextParallelConfig):
        with pytest.raises(ValueError, match="Invalid cp_comm_strategy"):
            config(cp_comm_strategy="ring")


@pytest.mark.parametrize(("module", "names"), [
    ("utils.constants", ["DTENSOR_PYTORCH_VERSION", "BETA_TP_AVAILABLE_PYTORCH_VERSION", "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
                         "BETA_CP_AVAILABLE_PYTORCH_VERSION", "BETA_SP_AVAILABLE_DEEPSPEED_VERSION"]),
    ("utils.dataclasses", ["BETA_TP_AVAILABLE_PYTORCH_VERSION", "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION", "BETA_CP_AVAILABLE_PYTORCH_VERSION"]),
    ("accelerator", ["DTENSOR_PYTORCH_VERSION"]),
])
def test_version_constants_match_hf(module, names):
    ours, hf = importlib.import_module(f"accelerate_ref.{module}"), importlib.import_module(f"accelerate.{module}")
    assert {name: getattr(ours, name) for name in names} == {name: getattr(hf, name) for name in names}


def test_device_mesh_needs_a_device_type_and_keeps_its_own():
    for config in (ParallelismConfig(), HfConfig()):
        with pytest.raises(ValueError, match="device_type"):
            config.get_device_mesh()
        assert config.build_device_mesh("cpu") is None, "no dimension enabled: no mesh"


class _RecordedMesh:
    """What `init_device_mesh` was given, and every ``mesh[key]._flatten(name)`` as ``(key, name)``, key as passed."""

    def __init__(self, device_type, mesh_shape, mesh_dim_names) -> None:
        self.built = (device_type, mesh_shape, mesh_dim_names)
        self.flattened = []

    def __getitem__(self, key):
        return SimpleNamespace(_flatten=lambda name: self.flattened.append((key, name)))


def recorded_mesh(config) -> tuple:
    with mock.patch("torch.distributed.device_mesh.init_device_mesh", _RecordedMesh):
        mesh = config.build_device_mesh("cpu")
    return (mesh.built, mesh.flattened) if mesh is not None else None


@pytest.mark.parametrize("sizes", CONFIGS, ids=[",".join(f"{k}={v}" for k, v in c.items() if k.endswith("size")) or "defaults" for c in CONFIGS])
def test_device_mesh_names_and_flattened_keys_match_hf_types_included(sizes):
    """HF indexes the mesh with the ``*_dim_names`` lists and builds it from tuples (its tests compare both)."""
    ours, hf = recorded_mesh(ParallelismConfig(**sizes)), recorded_mesh(HfConfig(**sizes))
    assert ours == hf
    if ours is not None:
        (_, shape, names), flattened = ours
        assert type(shape) is tuple and type(names) is tuple
        assert flattened and all(type(key) is list for key, _ in flattened)


def test_to_json_copies_the_fields():
    config = ParallelismConfig(dp_shard_size=2, cp_size=2)
    config.device_mesh = "a mesh"
    as_json = config.to_json()
    assert as_json == {**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}, "cp_handler": {"cp_comm_strategy": "allgather"},
                       "_sizes": {"dp_replicate": 1, "dp_shard": 2, "tp": 1, "cp": 2, "sp": 1}}
    as_json["cp_handler"]["cp_comm_strategy"] = "alltoall"
    assert config.cp_handler.cp_comm_strategy == "allgather", "a deep copy"


def test_a_size_assigned_after_construction_keeps_its_validated_size_in_the_mesh_as_hf():
    """The enabled dimensions and total_size follow the field; `_get_mesh` gives the size validated at construction."""
    seen = []
    for make in (ParallelismConfig, HfConfig):
        config = make()
        config.dp_shard_size = 2
        seen.append((config._get_mesh(), config.total_size, config._sizes, sorted(vars(config))))
    assert seen[0] == seen[1] and seen[0][0] == (("dp_shard",), (1,))


def test_set_size_changes_the_field_and_the_mesh_and_refuses_an_unknown_dimension_as_hf():
    seen = []
    for make in (ParallelismConfig, HfConfig):
        config = make(dp_shard_size=2)
        config._set_size("tp", 2)
        with pytest.raises(AssertionError) as refused:
            config._set_size("ep", 2)
        seen.append((config._get_mesh(), config.tp_size, config.tp_enabled, str(refused.value)))
    assert seen[0] == seen[1] and seen[0][0] == (("dp_shard", "tp"), (2, 2))


class Config:
    def __init__(self, distributed_config):
        self.distributed_config = distributed_config


@pytest.mark.parametrize("attributes", [{}, {"tp_size": 4}, {"config": Config({"tp_size": 2})}, {"config": Config(SimpleNamespace(tp_size=3))},
                                        {"config": Config(SimpleNamespace())}, {"tp_size": None, "config": Config({"tp_size": 8})}],
                         ids=["plain", "attribute", "dict", "object", "object-without", "config-over-none"])
def test_get_model_tp_size_matches_hf(attributes):
    model = torch.nn.Linear(2, 2)
    for name, value in attributes.items():
        setattr(model, name, value)
    assert get_model_tp_size(model) == hf_other.get_model_tp_size(model)
    assert model_has_dtensor(model) is hf_other.model_has_dtensor(model) is False


# -- the Accelerator, one process ------------------------------------------------

def fresh(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


RANKS = ["data_parallel_rank", "data_parallel_shard_rank", "tensor_parallel_rank", "pipeline_parallel_rank", "context_parallel_rank"]


def outcomes(accelerator) -> dict:
    seen = {}
    for name in RANKS:
        try:
            seen[name] = getattr(accelerator, name)
        except (RuntimeError, NotImplementedError) as error:
            seen[name] = type(error).__name__
    seen["mesh"] = accelerator.torch_device_mesh
    seen["composable"] = accelerator.is_composable_parallelism_enabled
    seen["config"] = None if accelerator.parallelism_config is None else accelerator.parallelism_config.total_size
    with accelerator.maybe_context_parallel(buffers=[torch.zeros(2, 4)], buffer_seq_dims=[1]):
        seen["context"] = "entered"
    return seen


@pytest.mark.parametrize("given", ["none", "argument", "environment"])
def test_single_process_accelerator_matches_hf(given, monkeypatch, fresh_accelerate_state):
    """One process: ranks 0 with a configuration (RuntimeError without), pipeline/context ranks refused, no mesh."""
    from accelerate import Accelerator as HfAccelerator
    from accelerate.state import AcceleratorState as HfState

    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true" if given == "environment" else "false")
    HfState._reset_state(True)
    try:
        hf = outcomes(HfAccelerator(parallelism_config=HfConfig() if given == "argument" else None))
    finally:
        HfState._reset_state(True)
    ours = outcomes(fresh(parallelism_config=ParallelismConfig() if given == "argument" else None))
    assert ours == hf
    assert (ours["config"] is None) is (given == "none")


def test_unsupported_dimensions_are_refused_by_name(fresh_accelerate_state):
    with pytest.raises(NotImplementedError, match="cp > 1"):
        fresh(parallelism_config=ParallelismConfig(cp_size=2))
    with pytest.raises(NotImplementedError, match="sp > 1"):
        fresh(parallelism_config=ParallelismConfig(sp_size=2, sp_handler=HANDLER))
    with pytest.raises(NotImplementedError, match="tp, cp > 1"):
        fresh(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2, tp_handler=HANDLER, cp_size=2))
    with pytest.raises(AttributeError, match="get_device_mesh"):  # HF 1.15 builds the mesh first
        fresh(parallelism_config={"dp_shard_size": 2})
    with pytest.raises(ValueError, match="env:// rendezvous"):  # a mesh of 2 in a world of 1: torch's refusal
        fresh(parallelism_config=ParallelismConfig(dp_shard_size=2))


# -- 4 ranks on 2 simulated machines ----------------------------------------------

def mesh_facts(mesh) -> dict:
    flattened = {name: (mesh[name].size(), mesh[name].get_local_rank()) for name in ("dp", "dp_shard_cp", "dp_cp")}
    return {"shape": tuple(mesh.shape), "names": mesh.mesh_dim_names, "coordinate": mesh.get_coordinate(),
            "grid": mesh.mesh.tolist(), "flattened": flattened}


def loader_batches(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def rank_checks() -> dict:
    from accelerate.data_loader import prepare_data_loader as hf_prepare
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from accelerate_ref.data_loader import prepare_data_loader
    from accelerate_ref.utils import FullyShardedDataParallelPlugin

    report: dict = {}
    accelerator = fresh(parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))
    report["accelerator"] = {
        "mesh": mesh_facts(accelerator.torch_device_mesh),
        "ranks": (accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank, accelerator.tensor_parallel_rank),
        "wrapped": type(accelerator.prepare(torch.nn.Linear(2, 2))).__name__,
        "batches": loader_batches(accelerator.prepare(torch.utils.data.DataLoader(torch.arange(16), batch_size=2))),
    }
    report["meshes"], meshes = {}, {}
    for sizes in ({"dp_replicate_size": 2, "dp_shard_size": 2}, {"dp_shard_size": 2, "cp_size": 2}, {"dp_shard_size": 4},
                  {"dp_shard_size": 2, "tp_size": 2, "tp_handler": HANDLER}):
        key = ",".join(f"{k}={v}" for k, v in sizes.items() if k.endswith("size"))
        meshes[key] = ParallelismConfig(**sizes).get_device_mesh("cpu")
        report["meshes"][key] = (mesh_facts(meshes[key]), mesh_facts(HfConfig(**sizes).get_device_mesh("cpu")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh(parallelism_config=ParallelismConfig(dp_shard_size=4, cp_handler=TorchContextParallelConfig()))
    report["ignored_handler"] = [str(w.message) for w in caught if "cp_handler is set, but cp_size is set to 1" in str(w.message)]
    default = fresh(parallelism_config=ParallelismConfig())
    report["default"] = (default.parallelism_config.dp_replicate_size, default.torch_device_mesh)

    tp_mesh = meshes["dp_shard_size=2,tp_size=2"]
    refusals = []
    for config in (ParallelismConfig(dp_shard_size=4), HfConfig(dp_shard_size=4)):
        config.get_device_mesh("cpu")
        with pytest.raises(ValueError, match="already created with device type cpu") as caught:
            config.get_device_mesh("meta")
        refusals.append(type(caught.value).__name__)
    report["other_device"] = refusals
    data = torch.utils.data.DataLoader(torch.arange(16), batch_size=2)
    report["loaders"] = {}
    for dimension in ("tp", "cp"):
        mesh = meshes[f"dp_shard_size=2,{dimension}_size=2"]
        # HF's own PartialState did not set this process group up and sees one process: the rank is passed.
        report["loaders"][dimension] = (loader_batches(prepare_data_loader(data, torch_device_mesh=mesh)),
                                        loader_batches(hf_prepare(data, num_processes=4, process_index=mesh.get_rank(), torch_device_mesh=mesh)))
    report["loaders"]["dispatch"] = loader_batches(prepare_data_loader(data, put_on_device=True, dispatch_batches=True, torch_device_mesh=tp_mesh))

    model = parallelize_module(torch.nn.Linear(4, 4), tp_mesh["tp"], ColwiseParallel())
    model.tp_size = 2
    report["dtensor"] = (model_has_dtensor(model), hf_other.model_has_dtensor(model), get_model_tp_size(model), hf_other.get_model_tp_size(model))

    fsdp = {}
    for sizes, version in (({"dp_shard_size": 4}, 2), ({"dp_replicate_size": 2, "dp_shard_size": 2}, 2),
                           ({"dp_replicate_size": 2, "dp_shard_size": 2}, 1), ({"dp_replicate_size": 4}, 2), ({}, 2)):
        try:
            sharded = fresh(parallelism_config=ParallelismConfig(**sizes), fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=version))
            model = sharded.prepare(torch.nn.Linear(4, 4))
            fsdp[f"v{version}:{sizes}"] = (model_has_dtensor(model), sharded.is_composable_parallelism_enabled,
                                           tuple(model.weight.device_mesh.shape))
        except ValueError as error:
            fsdp[f"v{version}:{sizes}"] = str(error)
    report["fsdp"] = fsdp
    return report


@pytest.mark.slow
def test_four_ranks_match_hf_meshes_and_share_batches_by_data_parallel_rank():
    reports = simulators.run(rank_checks, world=4, machines=2, timeout=240, env={"ACCELERATE_USE_CPU": "1"})
    for rank, report in enumerate(reports):
        for key, (ours, hf) in report["meshes"].items():
            assert ours == hf, f"rank {rank}, {key}: our mesh {ours} vs HF's {hf}"
        acc = report["accelerator"]
        hf_mesh = report["meshes"]["dp_replicate_size=2,dp_shard_size=2"][1]
        assert acc["mesh"] == hf_mesh
        assert acc["ranks"] == (hf_mesh["coordinate"][0], hf_mesh["coordinate"][1], 0), "ranks are the mesh coordinates"
        assert acc["wrapped"] == "DistributedDataParallel", "data parallel over every rank without FSDP, as HF"
        assert report["default"] == (4, None), "a default config replicates over every rank, without a mesh (HF 1.15)"
        assert len(report["ignored_handler"]) == (rank == 0), "the main process warns of a handler for a size-1 dimension"
        for dimension in ("tp", "cp"):
            ours, hf = report["loaders"][dimension]
            assert ours == hf, f"rank {rank}: the shard under a {dimension} mesh differs from HF's"
        assert report["dtensor"] == (True, True, 2, 2)
        assert report["other_device"] == ["ValueError", "ValueError"], "a built mesh keeps its device type"
        fsdp = report["fsdp"]
        assert fsdp["v2:{'dp_shard_size': 4}"] == (True, True, (4,)), "dp_shard alone: sharded over every rank"
        assert fsdp["v2:{'dp_replicate_size': 2, 'dp_shard_size': 2}"] == (True, True, (2, 2)), "dp_replicate x dp_shard: HSDP"
        assert fsdp["v1:{'dp_replicate_size': 2, 'dp_shard_size': 2}"] == (
            "ParallelismConfig is only compatible DistributedType.FSDP (version 2) or DistributedType.Multi{Device} or "
            "DistributedType.DEEPSPEED, but got DistributedType.MULTI_CPU."), "FSDP1 is refused with a config, in HF's words"
        assert "no dimension for FSDP" in fsdp["v2:{'dp_replicate_size': 4}"], "nothing to shard across is refused"
        assert fsdp["v2:{}"][:2] == (True, True), "the defaults under FSDP2 stay as they are (not multi-device: HF 1.15)"
    batches = [report["accelerator"]["batches"] for report in reports]
    assert sorted(sum(sum(batches, []), [])) == list(range(16)), "dp_replicate x dp_shard ranks split the data"
    for name in ("tp", "cp", "dispatch"):
        per_rank = [report["loaders"][name] if name == "dispatch" else report["loaders"][name][0] for report in reports]
        assert per_rank[0] == per_rank[1] and per_rank[2] == per_rank[3], f"{name}: a tp group reads the same batches"
        assert per_rank[0] != per_rank[2], f"{name}: data-parallel ranks read different batches"
        assert sorted(sum(per_rank[0] + per_rank[2], [])) == list(range(16)), f"{name}: together they read the data once"


# -- a model sharded by Transformers' own tensor parallelism, 2 ranks ------------------

def transformers_tensor_parallel(folder: str) -> dict:
    """A tiny Llama loaded from ``folder`` with Transformers' tensor parallelism over this world of 2
    (``tp_plan="auto"`` under Transformers 4; under 5 ``DistributedConfig(tp_size=2)``, which Transformers keeps in
    ``model.config.distributed_config``): how accelerate_ref and HF read it, and accelerate_ref's refusal of tp."""
    import transformers

    fresh()  # gloo over the world: the process group Transformers shards over
    if int(transformers.__version__.split(".")[0]) >= 5:
        from transformers.distributed import DistributedConfig

        options = {"distributed_config": DistributedConfig(tp_size=2)}
    else:
        options = {"tp_plan": "auto"}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, **options)
    tokens = torch.arange(8)[None] % 32
    report = {
        "tp_size": (get_model_tp_size(model), hf_other.get_model_tp_size(model)),
        "dtensor": (model_has_dtensor(model), hf_other.model_has_dtensor(model)),
        "distributed_config": getattr(getattr(model.config, "distributed_config", None), "tp_size", None),
        "loss": model(input_ids=tokens, labels=tokens).loss.item(),
    }
    try:
        fresh(parallelism_config=ParallelismConfig(tp_size=2))  # the default tp handler: transformers >= 4.52
        report["refusal"] = None
    except NotImplementedError as error:
        report["refusal"] = str(error)
    return report


@pytest.mark.slow
@pytest.mark.skipif(not is_transformers_available(), reason="transformers is not installed (extra transformers)")
def test_a_model_sharded_by_transformers_tensor_parallelism_reads_as_in_hf(tmp_path):
    """HF 1.15's prepare checks a tp model's degree with `get_model_tp_size`, which reads ``model.tp_size``
    (Transformers < 5) or ``config.distributed_config`` (>= 5): on a real sharded model, under whichever Transformers
    is installed, ours reads what HF's does, and `Accelerator(parallelism_config=...)` with tp > 1 is refused by name."""
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    if Version(transformers.__version__) < Version(hf_utils.dataclasses.BETA_TP_AVAILABLE_TRANSFORMERS_VERSION):
        pytest.skip("HF's tensor parallelism needs a newer transformers")
    folder = tmp_path / "llama"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                                           num_attention_heads=2, num_key_value_heads=2)).save_pretrained(folder)
    reports = simulators.run(transformers_tensor_parallel, world=2, args=(str(folder),), timeout=240, env={"ACCELERATE_USE_CPU": "1"})
    for report in reports:
        assert report["tp_size"] == (2, 2) and report["dtensor"] == (True, True), report
        if Version(transformers.__version__).major >= 5:
            assert report["distributed_config"] == 2, "Transformers 5 keeps the degree in config.distributed_config"
        assert report["refusal"] is not None and "tp" in report["refusal"], report["refusal"]
    assert reports[0]["loss"] == reports[1]["loss"], "the sharded forward agrees across ranks"
