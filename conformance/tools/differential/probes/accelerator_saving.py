"""Probes of ``accelerate.accelerator``'s saving members (``save``, ``save_model``, ``get_state_dict``,
``register_for_checkpointing``, the state pre-hooks and the refusals of ``save_state``/``load_state``) and its
parallelism members (the ranks of a ``ParallelismConfig``, ``maybe_context_parallel``, the Ulysses loader
adapter).

Checkpoint contents are the checkpointing probes' business; here, what each method accepts and refuses.
"""

from __future__ import annotations

import os
import shutil
from collections import OrderedDict
from pathlib import Path

import torch

from ..probe import Api, probe
from .parallelism_config_meshes import describe_mesh, size_tuples

AREA = "accelerator"


class _Counter:
    """A custom object with a state dict."""

    def __init__(self) -> None:
        self.count = 3

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


class _NoLoad:
    def state_dict(self) -> dict:
        return {}


@probe(AREA, worlds=(1, 2))
def save(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("save a list", accelerator.save, [0, 1, 2, 3], "array.pkl")
    api.observe("save a state dict with safetensors", accelerator.save, {"w": torch.ones(2)}, "weights.safetensors",
                safe_serialization=True)
    api.observe("save a list with safetensors", accelerator.save, [1], "list.safetensors", safe_serialization=True)
    accelerator.wait_for_everyone()
    api.observe("reload", lambda: torch.load("array.pkl", weights_only=True))


@probe(AREA, worlds=(1, 2))
def save_model(api: Api) -> None:
    accelerator = api.accelerator()
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    api.observe("save_model", accelerator.save_model, model, "model")
    api.observe("save_model as pickle", accelerator.save_model, model, "pickled", safe_serialization=False)
    api.observe("save_model in shards", accelerator.save_model, model, "sharded", max_shard_size=20)
    unsorted = accelerator.prepare(torch.nn.Sequential(OrderedDict(z=torch.nn.Linear(3, 2), a=torch.nn.Linear(2, 2))))
    api.observe("save_model in shards, names out of order", accelerator.save_model, unsorted, "unsorted",
                max_shard_size=20)
    accelerator.wait_for_everyone()
    api.observe("the index file as written", lambda: Path("unsorted", "model.safetensors.index.json").read_text())
    with open("a_file", "w") as handle:
        handle.write("x")
    api.observe("save_model to a file", accelerator.save_model, model, "a_file")
    with torch.device("meta"):
        meta = torch.nn.Linear(2, 2)
    api.observe("save_model of a model on the meta device", accelerator.save_model, meta, "meta")
    accelerator.wait_for_everyone()
    api.observe("folders", lambda: sorted(os.listdir(".")))


@probe(AREA, worlds=(1, 2))
def get_state_dict(api: Api) -> None:
    accelerator = api.accelerator()
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    api.observe("unwrapped", accelerator.get_state_dict, model)
    api.observe("wrapped", lambda: sorted(accelerator.get_state_dict(model, unwrap=False)))
    api.observe("a non-module", accelerator.get_state_dict, "text")


@probe(AREA)
def register_for_checkpointing(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("valid objects", accelerator.register_for_checkpointing, _Counter(), torch.nn.Linear(1, 1))
    api.observe("invalid objects", accelerator.register_for_checkpointing, _Counter(), _NoLoad(), 3, "x")
    api.observe("nothing", accelerator.register_for_checkpointing)
    api.observe("registered", lambda: [type(obj).__name__ for obj in accelerator._custom_objects])


@probe(AREA)
def state_pre_hooks(api: Api) -> None:
    accelerator = api.accelerator()
    calls = []
    handle = api.observe("register_save_state_pre_hook", accelerator.register_save_state_pre_hook,
                         lambda models, weights, folder: calls.append(("save", len(models), len(weights))))
    api.observe("register_load_state_pre_hook", accelerator.register_load_state_pre_hook,
                lambda models, folder: calls.append(("load", len(models))))
    accelerator.prepare(torch.nn.Linear(2, 2))
    api.observe("save_state", lambda: os.path.basename(accelerator.save_state("checkpoint")))
    api.observe("load_state", accelerator.load_state, "checkpoint")
    if handle is not None:
        api.observe("remove", handle.remove)
    api.observe("save_state after removal", lambda: os.path.basename(accelerator.save_state("checkpoint2")))
    api.record("calls", calls)
    _forget_checkpoints()


def _forget_checkpoints() -> None:
    """Remove what save_state wrote: checkpoint contents are the checkpointing probes' business."""
    for folder in ("checkpoint", "checkpoint2", "project"):
        shutil.rmtree(folder, ignore_errors=True)


@probe(AREA)
def save_and_load_state_refusals(api: Api) -> None:
    accelerator = api.accelerator()
    api.observe("load_state of a missing folder", accelerator.load_state, "missing")
    api.observe("load_state without a folder", accelerator.load_state)
    api.get("state.AcceleratorState")._reset_state(True)
    project = api.get("utils.ProjectConfiguration")(project_dir="project", automatic_checkpoint_naming=True)
    accelerator = api.accelerator(project_config=project)
    api.observe("save_state with automatic naming", lambda: os.path.relpath(accelerator.save_state()))
    accelerator.project_configuration.iteration = 0
    api.observe("save_state over an existing checkpoint", lambda: os.path.relpath(accelerator.save_state()))
    api.observe("save_iteration", getattr, accelerator, "save_iteration")
    _forget_checkpoints()


@probe(AREA)
def automatic_naming_after_load(api: Api) -> None:
    """``load_state()`` of the latest automatic checkpoint: the step counter and the next save's number it leaves."""
    project = api.get("utils.ProjectConfiguration")
    accelerator = api.accelerator(project_config=project(project_dir="project", automatic_checkpoint_naming=True),
                                  gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    for _ in range(3):
        with accelerator.accumulate(model):
            pass
    api.observe("saves", lambda: [os.path.relpath(accelerator.save_state()) for _ in range(2)])
    api.get("state.AcceleratorState")._reset_state(True)
    fresh = api.accelerator(project_config=project(project_dir="project", automatic_checkpoint_naming=True),
                            gradient_accumulation_steps=2)
    fresh.prepare(torch.nn.Linear(2, 2))
    api.observe("load_state of the latest", fresh.load_state)
    api.record("step after it", fresh.step)
    api.record("iteration after it", fresh.project_configuration.iteration)
    api.observe("the next save", lambda: os.path.relpath(fresh.save_state()))
    _forget_checkpoints()


# -- parallelism ----------------------------------------------------------------------------------------


@probe(AREA, worlds=(1, 2))
def parallelism_ranks(api: Api) -> None:
    config = api.get("ParallelismConfig")(dp_replicate_size=api.world_size)
    accelerator = api.observe("with a ParallelismConfig", api.accelerator, parallelism_config=config)
    if accelerator is None:
        return
    for name in ("tensor_parallel_rank", "data_parallel_rank", "data_parallel_shard_rank",
                 "pipeline_parallel_rank", "context_parallel_rank", "should_save_model",
                 "is_composable_parallelism_enabled"):
        api.observe(name, getattr, accelerator, name)
    api.observe("mesh", lambda: (accelerator.torch_device_mesh.mesh_dim_names,
                                 accelerator.torch_device_mesh.mesh.tolist())
                if accelerator.torch_device_mesh is not None else None)


#: Ranks' members of an Accelerator under a ParallelismConfig.
PARALLELISM_RANKS = ("tensor_parallel_rank", "data_parallel_rank", "data_parallel_shard_rank",
                     "is_composable_parallelism_enabled")


@probe(AREA, worlds=(1, 2), families=("cuda",))
def parallelism_meshes_of_the_world(api: Api) -> None:
    """`Accelerator(parallelism_config=...)` for each data-parallel split of this world (dp_replicate x dp_shard
    equal to the world size), the default configuration (resized to replicate over every rank) and one a rank too
    large: accepted or refused, the mesh it keeps (`describe_mesh`), the sizes after, this rank's indices.

    On GPUs, where HF 1.15 takes a ParallelismConfig: on CPU ranks it refuses every one of total size > 1
    (``parallelism_ranks`` and its deviation)."""
    reset = api.get("state.AcceleratorState")._reset_state
    make = api.get("ParallelismConfig")
    splits = {f"dp_replicate {replicate}, dp_shard {shard}": {"dp_replicate_size": replicate, "dp_shard_size": shard}
              for replicate, shard in size_tuples(api.world_size, 2)}
    cases = {**splits, "the defaults": {}, "a rank too many": {"dp_shard_size": api.world_size + 1}}
    plugin = api.get("utils.FullyShardedDataParallelPlugin")
    fsdp = {f"{label}, FSDP {version}": (sizes, {"fsdp_plugin": plugin(fsdp_version=version)})
            for label, sizes in {**splits, "the defaults": {}}.items() for version in (1, 2)} if api.world_size > 1 else {}
    for label, (sizes, plugins) in {**{label: (sizes, {}) for label, sizes in cases.items()}, **fsdp}.items():
        config = make(**sizes)
        accelerator = api.observe(label, api.accelerator, parallelism_config=config, **plugins)
        if accelerator is not None:
            api.observe(f"{label}: mesh", lambda: describe_mesh(accelerator.torch_device_mesh))
            api.record(f"{label}: sizes after", config._get_mesh())
            for name in PARALLELISM_RANKS:
                api.observe(f"{label}: {name}", getattr, accelerator, name)
        reset(True)


@probe(AREA)
def parallelism_config_refusals(api: Api) -> None:
    reset = api.get("state.AcceleratorState")._reset_state
    config_class = api.get("ParallelismConfig")
    api.observe("not a ParallelismConfig", api.accelerator, parallelism_config={"dp_shard_size": 1})
    reset(True)
    api.observe("a size larger than the world", api.accelerator, parallelism_config=config_class(dp_shard_size=2))
    reset(True)
    os_environ_config = api.observe("from the environment", lambda: _from_environment(api))
    api.record("from the environment: config", os_environ_config)


def _from_environment(api: Api):
    os.environ["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    return api.accelerator().parallelism_config


@probe(AREA)
def maybe_context_parallel(api: Api) -> None:
    accelerator = api.accelerator()
    buffer = torch.arange(4).view(1, 4)

    def run():
        with accelerator.maybe_context_parallel(buffers=[buffer], buffer_seq_dims=[1]):
            return buffer.clone()

    api.observe("without context parallelism", run)
    api.observe("again (the warning is given once)", run)


@probe(AREA)
def deepspeed_ulysses_dl_adapter(api: Api) -> None:
    accelerator = api.accelerator()
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    api.observe("without sequence parallelism", lambda: accelerator.deepspeed_ulysses_dl_adapter(
        loader, torch.nn.Linear(1, 1)) is loader)
