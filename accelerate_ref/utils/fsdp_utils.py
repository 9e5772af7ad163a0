"""FSDP through torch's own ``fully_shard`` (FSDP2) on a device mesh: sharding, wrapping, state dicts, merging.

`Accelerator.prepare_model` calls `shard_model` when a
`FullyShardedDataParallelPlugin` was given. FSDP1's strategies map onto
FSDP2: FULL_SHARD / SHARD_GRAD_OP shard over every rank (resharding after
forward or not), NO_SHARD replicates (a mesh whose shard dimension is 1),
HYBRID_SHARD / HYBRID_SHARD_ZERO2 replicate across machines and shard within
one (a 2-D mesh machines x ranks per machine). Sharded state dicts go through
``torch.distributed.checkpoint`` (one file per rank plus metadata).

Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_state_dict, plugin.fsdp_wrap_policy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from .constants import FSDP_MODEL_NAME, OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from .engine_plugins import FullyShardedDataParallelPlugin, get_module_class_from_name


def wrap_targets(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin) -> list[str]:
    """Names of the submodules the plugin's ``auto_wrap_policy`` shards as units of their own (root excluded).

    Rules: "transformer_based_wrap" wraps every instance of the classes in
    ``transformer_cls_names_to_wrap`` (or the model's ``_no_split_modules``),
    each resolved with `get_module_class_from_name` (an unknown name is a
    ValueError naming it); "size_based_wrap" wraps the innermost modules
    whose own subtree has at least ``min_num_params`` parameters (default
    1e8) that are not already covered by a wrapped descendant; a callable
    gets each module and answers; "no_wrap" and None wrap nothing.
    Catalog: plugin.fsdp_wrap_policy.
    """
    policy = plugin.auto_wrap_policy
    named = [(name, module) for name, module in model.named_modules() if name]
    if policy in (None, "no_wrap"):
        return []
    if callable(policy):
        return [name for name, module in named if policy(module)]
    if policy == "transformer_based_wrap":
        class_names = plugin.transformer_cls_names_to_wrap or list(getattr(model, "_no_split_modules", None) or [])
        if not class_names:
            raise ValueError("auto_wrap_policy transformer_based_wrap needs transformer_cls_names_to_wrap")
        classes = []
        for class_name in class_names:
            found = get_module_class_from_name(model, class_name)
            if found is None:
                raise ValueError(f"transformer_cls_names_to_wrap: no module class named {class_name!r} in the model")
            classes.append(found)
        return [name for name, module in named if isinstance(module, tuple(classes))]
    threshold = int(plugin.min_num_params if plugin.min_num_params is not None else 1e8)
    chosen: list[str] = []
    for name, module in reversed(named):  # children before parents
        covered = sum(p.numel() for child in chosen if child.startswith(name + ".") for p in model.get_submodule(child).parameters())
        if sum(p.numel() for p in module.parameters()) - covered >= threshold:
            chosen.append(name)
    return sorted(chosen, key=[n for n, _ in named].index)


def require_fsdp_device(device_type: str) -> None:
    """Refuse, naming the limit, a device type torch's ``fully_shard`` cannot run on here (NotImplementedError).

    XLA: DeviceMesh builds no process groups for ``"xla"`` (TPUs shard with
    torch_xla's own FSDP). Other accelerators need device streams
    (``torch.<device>.Stream``), which FSDP2 overlaps communication on.
    Catalog: plugin.fsdp.
    """
    if device_type == "xla":
        raise NotImplementedError(
            "FSDP through torch's fully_shard does not run on XLA devices (DeviceMesh builds no process groups "
            "for 'xla'); TPUs shard with torch_xla's FSDP, which accelerate_ref does not drive"
        )
    if device_type != "cpu" and not hasattr(getattr(torch, device_type, None), "Stream"):
        raise NotImplementedError(
            f"FSDP through torch's fully_shard needs device streams (torch.{device_type}.Stream), "
            f"which this {device_type} runtime does not provide"
        )


def device_mesh_for(plugin: FullyShardedDataParallelPlugin, state: Any) -> Any:
    """The device mesh of the plugin's strategy over this world (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh

    size, device_type = state.num_processes, state.device.type
    require_fsdp_device(device_type)
    if plugin.sharding_strategy == "NO_SHARD":
        return init_device_mesh(device_type, (size, 1), mesh_dim_names=("replicate", "shard"))
    if plugin.sharding_strategy.startswith("HYBRID_SHARD"):
        per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        return init_device_mesh(device_type, (size // per_machine, per_machine), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (size,), mesh_dim_names=("shard",))


def _mixed_precision(plugin: FullyShardedDataParallelPlugin) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = plugin.mixed_precision_policy
    return MixedPrecisionPolicy(**policy) if isinstance(policy, dict) else (policy or MixedPrecisionPolicy())


def shard_model(
    model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, state: Any
) -> tuple[torch.nn.Module, dict[int, torch.nn.Parameter]]:
    """``model`` sharded in place with ``fully_shard`` (each wrap target first, then the root), and the
    new parameter that replaced each old one, by the old one's ``id`` (for optimizers built before).

    Rules: parameters are broadcast from rank 0 first when
    ``sync_module_states`` (or ``cpu_ram_efficient_loading``) is set, so every
    rank shards the same values; ``activation_checkpointing`` checkpoints
    each wrap target; ``cpu_offload`` keeps shards on the CPU.
    Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_wrap_policy.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    if plugin.sync_module_states or plugin.cpu_ram_efficient_loading:
        for tensor in list(model.parameters()) + list(model.buffers()):
            torch.distributed.broadcast(tensor.data, src=0)
    targets = wrap_targets(model, plugin)
    if plugin.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

        chosen = {id(model.get_submodule(name)) for name in targets}
        apply_activation_checkpointing(model, check_fn=lambda module: id(module) in chosen)
        targets = wrap_targets(model, plugin)
    options: dict[str, Any] = {
        "mesh": device_mesh_for(plugin, state),
        "reshard_after_forward": plugin.reshard_after_forward,
        "mp_policy": _mixed_precision(plugin),
    }
    if plugin.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    before = dict(model.named_parameters())
    for name in targets:
        fully_shard(model.get_submodule(name), **options)
    fully_shard(model, **options)
    return model, {id(before[name]): parameter for name, parameter in model.named_parameters()}


def is_fsdp_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict of an FSDP ``model`` on every rank, on the CPU. Catalog: plugin.fsdp."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {key: value.detach().cpu() for key, value in state.items()}


def _sharded_dir(output_dir: str | os.PathLike, model_index: int) -> Path:
    return Path(output_dir) / f"{FSDP_MODEL_NAME}_{model_index}"


def _full_file(output_dir: str | os.PathLike, model_index: int) -> Path:
    suffix = "" if model_index == 0 else f"_{model_index}"
    return Path(output_dir) / f"{FSDP_MODEL_NAME}{suffix}.bin"


def save_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Any, model: torch.nn.Module, output_dir: str | os.PathLike, model_index: int = 0
) -> None:
    """Save an FSDP model by the plugin's ``state_dict_type``.

    Rules: FULL_STATE_DICT: the main process writes the unsharded weights to
    ``pytorch_model_fsdp.bin``; SHARDED_STATE_DICT: every rank writes its
    shard into ``pytorch_model_fsdp_<i>/`` with torch.distributed.checkpoint.
    Catalog: plugin.fsdp_state_dict.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    os.makedirs(output_dir, exist_ok=True)
    if fsdp_plugin.state_dict_type == "FULL_STATE_DICT":
        weights = full_state_dict(model)
        if accelerator.is_main_process:
            torch.save(weights, _full_file(output_dir, model_index))
    else:
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=_sharded_dir(output_dir, model_index))
    accelerator.wait_for_everyone()


def load_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Any, model: torch.nn.Module, input_dir: str | os.PathLike, model_index: int = 0
) -> None:
    """Load what `save_fsdp_model` wrote into the FSDP ``model`` (every rank takes its shard). Catalog: plugin.fsdp_state_dict."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    if fsdp_plugin.state_dict_type == "FULL_STATE_DICT":
        weights = torch.load(_full_file(input_dir, model_index), map_location="cpu", weights_only=True)
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    else:
        holder = {"model": get_model_state_dict(model)}
        dcp.load(holder, checkpoint_id=_sharded_dir(input_dir, model_index))
        set_model_state_dict(model, holder["model"])
    accelerator.wait_for_everyone()


def _state_dict_options(fsdp_plugin: FullyShardedDataParallelPlugin) -> Any:
    """torch's state dict options for the plugin's ``state_dict_type`` (full: unsharded tensors on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=fsdp_plugin.state_dict_type == "FULL_STATE_DICT")


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The user's optimizer inside a prepared one (torch's state dict helpers step it to create empty state)."""
    return getattr(optimizer, "optimizer", optimizer)


def _optimizer_file(output_dir: str | os.PathLike, optimizer_index: int) -> Path:
    suffix = "" if optimizer_index == 0 else f"_{optimizer_index}"
    return Path(output_dir) / f"{OPTIMIZER_NAME}{suffix}.bin"


def _optimizer_dir(output_dir: str | os.PathLike, optimizer_index: int) -> Path:
    return Path(output_dir) / f"{OPTIMIZER_NAME}_{optimizer_index}"


def optimizer_owner(optimizer: Any, models: list[torch.nn.Module]) -> Optional[torch.nn.Module]:
    """The model among ``models`` whose parameters ``optimizer`` steps (the first that holds one of them), or None."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return next((m for m in models if any(id(p) in stepped for p in m.parameters())), None)


def save_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike,
    optimizer_index: int = 0,
) -> None:
    """Save the state of an optimizer stepping the FSDP ``model``, by the plugin's ``state_dict_type``.

    Rules: FULL_STATE_DICT: the state is gathered unsharded (keyed by
    parameter name) and the main process writes ``optimizer.bin``
    (``optimizer_<i>.bin`` for i > 0); SHARDED_STATE_DICT: every rank writes
    its shard into ``optimizer_<i>/`` with torch.distributed.checkpoint.
    Collective: every process calls it. Catalog: plugin.fsdp_state_dict.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    os.makedirs(output_dir, exist_ok=True)
    state = get_optimizer_state_dict(model, _torch_optimizer(optimizer), options=_state_dict_options(fsdp_plugin))
    if fsdp_plugin.state_dict_type == "FULL_STATE_DICT":
        if accelerator.is_main_process:
            torch.save(state, _optimizer_file(output_dir, optimizer_index))
    else:
        dcp.save({"optimizer": state}, checkpoint_id=_optimizer_dir(output_dir, optimizer_index))
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike,
    optimizer_index: int = 0,
) -> None:
    """Load what `save_fsdp_optimizer` wrote into ``optimizer`` (every rank takes its shard of the state).

    Rules: a full state (read by every rank, without running code) is
    sharded like the model's parameters; a sharded one is read from
    ``optimizer_<i>/`` into this rank's shards. Collective.
    Catalog: plugin.fsdp_state_dict.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    options = _state_dict_options(fsdp_plugin)
    inner = _torch_optimizer(optimizer)
    if fsdp_plugin.state_dict_type == "FULL_STATE_DICT":
        state = torch.load(_optimizer_file(input_dir, optimizer_index), map_location="cpu", weights_only=True)
    else:
        holder = {"optimizer": get_optimizer_state_dict(model, inner, options=options)}
        dcp.load(holder, checkpoint_id=_optimizer_dir(input_dir, optimizer_index))
        state = holder["optimizer"]
    set_optimizer_state_dict(model, inner, state, options=options)
    accelerator.wait_for_everyone()


def merge_fsdp_weights(
    checkpoint_dir: str | os.PathLike, output_path: str | os.PathLike, safe_serialization: bool = True, remove_checkpoint_dir: bool = False
) -> Path:
    """Merge a sharded checkpoint (a torch.distributed.checkpoint directory) into one full weights file.

    Rules: runs in one process (no process group needed); writes
    ``model.safetensors`` (``pytorch_model.bin`` with
    ``safe_serialization=False``) into ``output_path`` and returns its path;
    a checkpoint saved by `save_fsdp_model` (keys under ``model.``) loses that
    prefix; ``remove_checkpoint_dir`` deletes the sharded directory after.
    A directory without DCP metadata is a ValueError naming it.
    Catalog: plugin.fsdp_state_dict.
    """
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    import torch.distributed.checkpoint as dcp

    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / ".metadata").is_file():
        raise ValueError(f"{checkpoint_dir} is not a sharded (torch.distributed.checkpoint) checkpoint: no .metadata")
    merged: dict[str, Any] = {}
    _load_state_dict(merged, storage_reader=dcp.FileSystemReader(checkpoint_dir), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    weights = merged.get("model", merged)
    os.makedirs(output_path, exist_ok=True)
    target = Path(output_path) / (SAFE_WEIGHTS_NAME if safe_serialization else WEIGHTS_NAME)
    if safe_serialization:
        from safetensors.torch import save_file

        save_file({key: value.contiguous() for key, value in weights.items()}, str(target), metadata={"format": "pt"})
    else:
        torch.save(weights, target)
    if remove_checkpoint_dir:
        shutil.rmtree(checkpoint_dir)
    return target
