"""FSDP through torch's own ``fully_shard`` (FSDP2) on a device mesh: sharding, wrapping, state dicts, merging.

`Accelerator.prepare_model` calls `shard_model` when a
`FullyShardedDataParallelPlugin` was given; both ``fsdp_version`` values run
on ``fully_shard``. FSDP1's strategies map onto it: FULL_SHARD / SHARD_GRAD_OP
shard over every rank (resharding after forward or not), NO_SHARD replicates
(a mesh whose shard dimension is 1), HYBRID_SHARD / HYBRID_SHARD_ZERO2
replicate across machines and shard within one (a 2-D mesh machines x ranks
per machine). ``fsdp_version=1`` keeps FSDP1's rules where they differ from
HF's FSDP2 path: its wrap policy recursion, ``param_init_fn`` and
``sync_module_states`` before sharding, and ``forward_prefetch`` /
``backward_prefetch`` as explicit prefetching between consecutive units.
``limit_all_gathers`` and ``use_orig_params`` have no ``fully_shard``
counterpart (it never floods all-gathers and always keeps the original
parameters): they are validated, as HF's, and change nothing. Sharded state
dicts go through ``torch.distributed.checkpoint`` (one file per rank plus
metadata) or per-rank ``torch.save`` files.

Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_state_dict, plugin.fsdp_wrap_policy.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import torch

from .constants import FSDP_MODEL_NAME, OPTIMIZER_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from ._dataclasses.fsdp import FullyShardedDataParallelPlugin, transformer_classes
from .modeling import is_peft_model
from ._modeling.sizes import get_non_persistent_buffers
from .other import get_module_children_bottom_up, is_compiled_module


def enable_fsdp_ram_efficient_loading() -> None:
    """Make transformers load pretrained weights on the first process only (``FSDP_CPU_RAM_EFFICIENT_LOADING``), and
    mark FSDP as in use (``ACCELERATE_USE_FSDP``) unless already set. Catalog: plugin.fsdp."""
    os.environ.setdefault("ACCELERATE_USE_FSDP", "True")
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "True"


def disable_fsdp_ram_efficient_loading() -> None:
    """Undo `enable_fsdp_ram_efficient_loading`'s loading mode (``FSDP_CPU_RAM_EFFICIENT_LOADING=False``). Catalog: plugin.fsdp."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "False"


def fsdp2_prepare_auto_wrap_policy(fsdp2_plugin: FullyShardedDataParallelPlugin, model: torch.nn.Module) -> Optional[Callable[[torch.nn.Module], bool]]:
    """The plugin's torch wrap policy as FSDP2's ``module -> bool`` (HF's rule), or None for any other policy.

    Rules: the transformer policy wraps instances of the classes named in
    ``transformer_cls_names_to_wrap`` (default: the model's ``_no_split_modules``;
    an absent class is a ValueError naming it), looking through activation
    checkpoint wrappers; the size policy wraps modules holding more than
    ``min_num_params`` parameters (their whole subtree). Catalog: plugin.fsdp_wrap_policy.
    """
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    function = fsdp2_plugin.auto_wrap_policy
    function = function.func if isinstance(function, functools.partial) else function
    if function is transformer_auto_wrap_policy:
        names = fsdp2_plugin.transformer_cls_names_to_wrap
        classes = tuple(transformer_classes(model, names if names is not None else list(getattr(model, "_no_split_modules", None) or [])))
        return lambda module: bool(classes) and isinstance(getattr(module, "_checkpoint_wrapped_module", module), classes)
    if function is size_based_auto_wrap_policy:
        return lambda module: sum(p.numel() for p in module.parameters()) > fsdp2_plugin.min_num_params
    return None


def _fsdp1_wrap_modules(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, device: Any) -> list[torch.nn.Module]:
    """The modules FSDP1 would wrap: torch's own recursion over the bound policy (``(module, recurse, nonwrapped_numel)``),
    ``ignored_modules`` left out."""
    from torch.distributed.fsdp.wrap import _recursive_wrap

    if plugin.auto_wrap_policy is None:
        return []
    chosen: list[torch.nn.Module] = []

    def record(module: torch.nn.Module, **_: Any) -> torch.nn.Module:
        chosen.append(module)
        return module

    ignored = _matching_modules(plugin.ignored_modules, model, device)
    ignored_params = {parameter for module in ignored for parameter in module.parameters()}
    _recursive_wrap(model, plugin.auto_wrap_policy, record, ignored_modules=set(ignored), ignored_params=ignored_params, only_wrap_children=True)
    return chosen


def _wrap_modules(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, device: Any = "cpu") -> list[torch.nn.Module]:
    """The submodules the plugin shards as units of their own (root excluded), children before parents."""
    plugin.set_auto_wrap_policy(model)
    if plugin.fsdp_version == 1:
        return _fsdp1_wrap_modules(model, plugin, device)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    return [] if policy is None else [module for module in get_module_children_bottom_up(model)[:-1] if policy(module)]


def wrap_targets(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin) -> list[str]:
    """Names of the submodules the plugin's ``auto_wrap_policy`` shards as units of their own (root excluded).

    Rules: ``fsdp_version=1`` follows FSDP1: torch's policy (bound by
    `FullyShardedDataParallelPlugin.set_auto_wrap_policy`, or the user's
    ``(module, recurse, nonwrapped_numel)`` callable) decides with the
    parameters not already in a wrapped descendant, so the size policy wraps the
    innermost modules reaching ``min_num_params``; ``fsdp_version=2`` follows
    `fsdp2_prepare_auto_wrap_policy`. No policy (no_wrap) wraps nothing.
    Catalog: plugin.fsdp_wrap_policy.
    """
    names = {id(module): name for name, module in model.named_modules()}
    return [names[id(module)] for module in _wrap_modules(model, plugin)]


def _checkpoint_layers(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, fsdp2: bool) -> torch.nn.Module:
    """``model`` with activation checkpointing on the layers the plugin's policy picks (HF's per-version rule).

    FSDP1: torch's ``apply_activation_checkpointing`` with the bound policy
    (non-reentrant); FSDP2: `fsdp2_prepare_auto_wrap_policy`'s layers, each in
    ``checkpoint_wrapper`` (and ``offload_wrapper`` with ``activation_checkpointing_offload``).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
        offload_wrapper,
    )

    if not fsdp2:
        wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, auto_wrap_policy=plugin.auto_wrap_policy)
        return model
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    for name, layer in get_module_children_bottom_up(model, return_fqns=True)[:-1]:
        if policy is not None and policy(layer):
            wrapped = checkpoint_wrapper(layer, preserve_rng_state=False)
            model.set_submodule(name, offload_wrapper(wrapped) if plugin.activation_checkpointing_offload else wrapped)
    return model


def fsdp2_apply_ac(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with activation checkpointing on each layer the FSDP2 wrap policy of
    ``accelerator.state.fsdp_plugin`` picks (offloaded to the CPU with ``activation_checkpointing_offload``).

    No wrap policy checkpoints nothing (HF 1.15 fails there calling None). Catalog: plugin.fsdp.
    """
    return _checkpoint_layers(model, accelerator.state.fsdp_plugin, fsdp2=True)


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


def _sharding_strategy_name(plugin: FullyShardedDataParallelPlugin) -> str:
    """FSDP1's strategy (``sharding_strategy``, else the one in ``reshard_after_forward``, as HF passes it); FSDP2 shards fully."""
    if plugin.fsdp_version == 2:
        return "FULL_SHARD"
    return (plugin.sharding_strategy or plugin.reshard_after_forward).name


def device_mesh_for(plugin: FullyShardedDataParallelPlugin, state: Any) -> Any:
    """The device mesh FSDP shards over: a `ParallelismConfig`'s FSDP dimensions where the Accelerator has one
    (HF's rule for FSDP2: dp_shard alone shards fully, dp_replicate x dp_shard is HSDP), else the mesh of the
    plugin's strategy over this world (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh

    config, mesh = getattr(state, "parallelism_config", None), getattr(state, "device_mesh", None)
    if config is not None and mesh is not None:
        return mesh[tuple(config.fsdp_dim_names)]

    size, device_type = state.num_processes, state.device.type
    require_fsdp_device(device_type)
    strategy = _sharding_strategy_name(plugin)
    if strategy == "NO_SHARD":
        return init_device_mesh(device_type, (size, 1), mesh_dim_names=("replicate", "shard"))
    if strategy.startswith("HYBRID_SHARD"):
        per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", size))
        return init_device_mesh(device_type, (size // per_machine, per_machine), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (size,), mesh_dim_names=("shard",))


def _shard_options(plugin: FullyShardedDataParallelPlugin, state: Any, model: torch.nn.Module) -> dict[str, Any]:
    """``fully_shard``'s keywords from the plugin: mesh, resharding, mixed precision, offload, ignored parameters.

    FSDP1's ``MixedPrecision`` gives its parameter and reduction dtypes (FSDP2
    keeps buffers in their dtype; autocast computes in the low one) and
    ``CPUOffload(offload_params=True)`` becomes ``CPUOffloadPolicy``.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    mixed = plugin.mixed_precision_policy
    if mixed is not None and not isinstance(mixed, MixedPrecisionPolicy):
        mixed = MixedPrecisionPolicy(param_dtype=mixed.param_dtype, reduce_dtype=mixed.reduce_dtype)
    offload = plugin.cpu_offload
    if not isinstance(offload, OffloadPolicy):
        offload = CPUOffloadPolicy() if offload.offload_params else OffloadPolicy()
    options = {
        "mesh": device_mesh_for(plugin, state),
        "reshard_after_forward": plugin.reshard_after_forward
        if plugin.fsdp_version == 2
        else _sharding_strategy_name(plugin) in ("FULL_SHARD", "HYBRID_SHARD"),
        "mp_policy": mixed or MixedPrecisionPolicy(),
        "offload_policy": offload,
    }
    if plugin.ignored_modules is not None:
        options["ignored_params"] = get_parameters_from_modules(plugin.ignored_modules, model, state.device)
    return options


def _materialize_and_sync(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, state: Any) -> None:
    """FSDP1's start: modules on the meta device run ``param_init_fn`` (ties kept by `ensure_weights_retied`); with
    ``sync_module_states`` every rank then takes rank 0's parameters and buffers."""
    if plugin.param_init_fn is not None:
        init = ensure_weights_retied(plugin.param_init_fn, model, state.device)
        for module in list(model.modules()):
            own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
            if any(tensor.is_meta for tensor in own):
                init(module)
    if plugin.sync_module_states:
        for tensor in list(model.parameters()) + list(model.buffers()):
            torch.distributed.broadcast(tensor.data, src=0)


def _upcast_trainable(model: torch.nn.Module, mixed_precision: str) -> None:
    """HF's rule under mixed precision: trainable low-precision parameters are held in float32 (the policy casts for compute)."""
    if mixed_precision != "no":
        for parameter in model.parameters():
            if parameter.requires_grad and parameter.dtype != torch.float32:
                parameter.data = parameter.data.to(torch.float32)


def _set_prefetching(units: list[Any], plugin: FullyShardedDataParallelPlugin) -> None:
    """FSDP1's ``forward_prefetch`` / ``backward_prefetch`` as FSDP2's explicit prefetching between consecutive units."""
    for earlier, later in zip(units, units[1:]):
        if plugin.forward_prefetch:
            earlier.set_modules_to_forward_prefetch([later])
        if plugin.backward_prefetch is not None:
            later.set_modules_to_backward_prefetch([earlier])


def _shard_embeddings_and_tail(model: torch.nn.Module, options: dict[str, Any]) -> None:
    """HF's FSDP2 units for a transformers model: the input embedding alone (unless tied), and the final norm with the
    output embedding (and a tied input embedding) as one unit that stays unsharded after forward."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    input_embed = getattr(model, "get_input_embeddings", lambda: None)()
    output_embed = getattr(model, "get_output_embeddings", lambda: None)()
    input_weight, output_weight = getattr(input_embed, "weight", None), getattr(output_embed, "weight", None)
    tied = input_weight is not None and input_weight is output_weight
    if not tied and input_embed is not None and not isinstance(input_embed, FSDPModule):
        fully_shard(input_embed, **options)
    base = getattr(model, getattr(model, "base_model_prefix", ""), None) or model
    norms = [module for module in base.children() if "Norm" in type(module).__name__] if isinstance(base, torch.nn.Module) else []
    final_norm = norms[-1] if norms else None
    tail = [m for m in ((final_norm, input_embed, output_embed) if tied else (final_norm, output_embed)) if m is not None and not isinstance(m, FSDPModule)]
    if tail:
        fully_shard(tail, **{**options, "reshard_after_forward": False})


def _fully_shard(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, state: Any, units: list[torch.nn.Module]) -> torch.nn.Module:
    """``model`` sharded in place: each of ``units`` first, then (FSDP2) HF's embedding and tail units, then the root."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

    _upcast_trainable(model, state.mixed_precision)
    if plugin.fsdp_version == 1:
        _materialize_and_sync(model, plugin, state)
    ram_efficient = plugin.fsdp_version == 2 and plugin.cpu_ram_efficient_loading
    if ram_efficient:  # rank 0's weights reach every rank's shards after sharding on the meta device
        full_state = model.state_dict()
        buffers = {name: buffer.clone() for name, buffer in model.named_buffers() if name in get_non_persistent_buffers(model, recurse=True, fqns=True)}
        model = model.to(torch.device("meta"))
        if hasattr(model, "tie_weights"):
            model.tie_weights()
    options = _shard_options(plugin, state, model)
    for unit in units:
        if not isinstance(unit, FSDPModule):
            fully_shard(unit, **options)
    if plugin.fsdp_version == 2:
        _shard_embeddings_and_tail(model, options)
        fully_shard(model, **{key: value for key, value in options.items() if key != "reshard_after_forward"})
    else:
        fully_shard(model, **options)
        _set_prefetching([module for module in model.modules() if isinstance(module, FSDPModule) and module is not model], plugin)
    if ram_efficient:
        fsdp2_load_full_state_dict(state, model, full_state, cpu_offload=isinstance(plugin.cpu_offload, CPUOffloadPolicy))
        for name, buffer in buffers.items():
            parent, _, leaf = name.rpartition(".")
            model.get_submodule(parent).register_buffer(leaf, buffer.to(state.device), persistent=False)
        if hasattr(model, "tie_weights"):
            model.tie_weights()
    return model


def shard_model(
    model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin, state: Any
) -> tuple[torch.nn.Module, dict[int, torch.nn.Parameter]]:
    """``model`` sharded in place with ``fully_shard`` (each wrap target first, then the root), and the
    new parameter that replaced each old one, by the old one's ``id`` (for optimizers built before).

    Rules: the wrap units are `wrap_targets`'; ``activation_checkpointing``
    checkpoints layers as `_checkpoint_layers` says; FSDP1: meta modules run
    ``param_init_fn`` and ``sync_module_states`` broadcasts rank 0's weights
    first; FSDP2: ``cpu_ram_efficient_loading`` shards on the meta device and
    loads rank 0's weights with `fsdp2_load_full_state_dict`. Mixed precision
    keeps trainable parameters in float32. ``ignored_modules`` stay unsharded.
    Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_wrap_policy.
    """
    before = dict(model.named_parameters())
    units = _wrap_modules(model, plugin, state.device)
    if plugin.activation_checkpointing:
        model = _checkpoint_layers(model, plugin, fsdp2=plugin.fsdp_version == 2)
    model = _fully_shard(model, plugin, state, units)
    after = fsdp2_canonicalize_names(dict(model.named_parameters()))
    return model, {id(before[name]): parameter for name, parameter in after.items() if name in before}


def fsdp2_prepare_model(accelerator: Any, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` sharded in place with FSDP2 by ``accelerator.state.fsdp_plugin`` (not checkpointed: see
    `fsdp2_apply_ac`); a model already sharded is returned as is. Catalog: plugin.fsdp."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) or (is_compiled_module(model) and isinstance(model._orig_mod, FSDPModule)):
        return model
    plugin = accelerator.state.fsdp_plugin
    return _fully_shard(model, plugin, accelerator.state, _wrap_modules(model, plugin, accelerator.state.device))


def fsdp2_load_full_state_dict(accelerator: Any, model: torch.nn.Module, full_sd: dict, cpu_offload: bool = False) -> torch.nn.Module:
    """Load ``full_sd`` (read on the main process only) into the sharded ``model`` in place: rank 0 broadcasts each
    full tensor and every rank keeps its shard, in the dtype the model holds (``cpu_offload``: on the CPU).

    Rule: a model key missing from the main process's ``full_sd`` is a KeyError naming it. Collective. Catalog: plugin.fsdp.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    shards = {}
    for name, sharded in model.state_dict().items():
        mesh = sharded.device_mesh
        if accelerator.is_main_process:
            if name not in full_sd:
                raise KeyError(f"Parameter '{name}' found in sharded model state dict but missing from full state dict.")
            full = full_sd[name].detach().to(mesh.device_type)
            full = full.to_local() if isinstance(full, DTensor) else full
        else:
            full = torch.empty(sharded.size(), device=mesh.device_type, dtype=sharded.dtype)
        torch.distributed.broadcast(full, src=0)
        shard = distribute_tensor(full, mesh, sharded.placements)
        if full.dtype.is_floating_point and full.dtype != getattr(torch, "float8_e4m3fn", None):
            shard = shard.to(dtype=sharded.dtype)
        shards[name] = (shard.to("cpu") if cpu_offload else shard).contiguous()
    model.load_state_dict(shards, assign=True)
    return model


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict) -> None:
    """Point ``optimizer``'s parameter groups at ``mapping[p.data_ptr]`` for each parameter ``p`` (HF's key: the
    original's ``data_ptr``). A parameter without a new one is a KeyError: training would step stale tensors.
    Catalog: plugin.fsdp."""
    try:
        for group in optimizer.param_groups:
            group["params"] = [mapping[parameter.data_ptr] for parameter in group["params"]]
    except KeyError:
        raise KeyError("A parameter in the optimizer couldn't be switched to its sharded version. This breaks the training.") from None


def fsdp2_canonicalize_names(named_params: dict) -> dict:
    """``named_params`` keyed by the names the parameters had before activation checkpointing and compilation
    wrapped their modules (``._checkpoint_wrapped_module`` and ``_orig_mod`` dropped). Catalog: plugin.fsdp."""
    canonical = {}
    for name, value in named_params.items():
        name = name.replace("._checkpoint_wrapped_module", "")
        name = name.removeprefix("_orig_mod.").replace("._orig_mod", "")
        canonical[name] = value
    return canonical


def get_fsdp2_grad_scaler(**kwargs: Any) -> Any:
    """torch's ``torch.amp.GradScaler(**kwargs)`` (FSDP2's; ``device`` names the device type). Catalog: autocast.fp16_scaler."""
    from torch.amp.grad_scaler import GradScaler

    return GradScaler(**kwargs)


def get_parameters_from_modules(modules: Union[Iterable[torch.nn.Module], str, None], model: torch.nn.Module, device: Any) -> set[torch.nn.Parameter]:
    """The parameters of ``modules``: modules, or a regular expression matched (fullmatch) against ``model``'s module
    names, whose matches move to ``device``. None gives an empty set. Catalog: plugin.fsdp."""
    return {parameter for module in _matching_modules(modules, model, device) for parameter in module.parameters()}


def _matching_modules(modules: Union[Iterable[torch.nn.Module], str, None], model: torch.nn.Module, device: Any) -> list[torch.nn.Module]:
    """``modules`` as a list: none for None; for a regular expression, ``model``'s modules whose name it fullmatches, moved to ``device``."""
    if modules is None:
        return []
    if isinstance(modules, str):
        pattern = re.compile(modules)
        return [module.to(device) for name, module in model.named_modules() if pattern.fullmatch(name)]
    return list(modules)


def ensure_weights_retied(param_init_fn: Any, model: torch.nn.Module, device: Any) -> Any:
    """``param_init_fn`` wrapped so that parameters tied in ``model`` (its ``_tied_weights_keys``) stay one tensor
    after initialisation re-creates them; ``param_init_fn`` itself when nothing is tied. Catalog: plugin.fsdp."""
    tied_names = getattr(model, "_tied_weights_keys", None)
    if not tied_names:
        return param_init_fn
    tied: dict[int, Optional[torch.nn.Parameter]] = {}
    for name in tied_names:
        owner, _, leaf = name.rpartition(".")
        tied[id(getattr(model.get_submodule(owner), leaf))] = None

    def init_keeping_ties(module: torch.nn.Module) -> torch.nn.Module:
        to_tie: dict[int, list[str]] = defaultdict(list)
        for name, parameter in module.named_parameters(recurse=False):
            if id(parameter) in tied:
                to_tie[id(parameter)].append(name)
        module = param_init_fn(module)
        for key, names in to_tie.items():
            for name in names:
                if tied[key] is None:
                    tied[key] = getattr(module, name)  # the first one seen is the one all share
                else:
                    setattr(module, name, tied[key])
        return module

    return init_keeping_ties


def is_fsdp_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded with ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict of an FSDP ``model`` on every rank, on the CPU. Catalog: plugin.fsdp."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {key: value.detach().cpu() for key, value in state.items()}


def _state_dict_type(plugin: FullyShardedDataParallelPlugin) -> str:
    return plugin.state_dict_type.name


def _prepare_sd_options(fsdp_plugin: FullyShardedDataParallelPlugin) -> Any:
    """torch's state dict options from the plugin: full for FULL_STATE_DICT; offload and rank-0 broadcast from its
    ``state_dict_config`` (``offload_to_cpu``, ``rank0_only``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(
        full_state_dict=_state_dict_type(fsdp_plugin) == "FULL_STATE_DICT",
        cpu_offload=getattr(fsdp_plugin.state_dict_config, "offload_to_cpu", False),
        broadcast_from_rank0=getattr(fsdp_plugin.state_dict_config, "rank0_only", False),
    )


def _model_state_dict(model: torch.nn.Module, adapter_only: bool, options: Any) -> dict:
    """The model's state dict under ``options``; with ``adapter_only`` on a peft model, the adapter's only."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if adapter_only and is_peft_model(model):
        if not options.full_state_dict:
            from peft import get_peft_model_state_dict

            return get_peft_model_state_dict(model, adapter_name=model.active_adapter)
        options = dataclasses.replace(options, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)


def _set_model_state(model: torch.nn.Module, state_dict: dict, adapter_only: bool, options: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    if adapter_only and is_peft_model(model):
        if not options.full_state_dict:
            from peft import set_peft_model_state_dict

            return set_peft_model_state_dict(model, state_dict, adapter_name=model.active_adapter)
        options = dataclasses.replace(options, strict=False)
    return set_model_state_dict(model, state_dict, options=options)


def _full_for_processes(fsdp_plugin: FullyShardedDataParallelPlugin, accelerator: Any) -> None:
    """HF's rule for FULL_STATE_DICT: offload and gather on rank 0 only when several processes run."""
    if _state_dict_type(fsdp_plugin) == "FULL_STATE_DICT":
        several = accelerator.num_processes > 1
        fsdp_plugin.state_dict_config.offload_to_cpu = several
        fsdp_plugin.state_dict_config.rank0_only = several


def _sharded_dir(output_dir: str | os.PathLike, model_index: int, name: str = FSDP_MODEL_NAME) -> Path:
    """``<dir>/<name>_<i>``, or ``dir`` itself when it is that folder already (HF's rule when loading)."""
    folder = f"{name}_{model_index}"
    return Path(output_dir) if Path(output_dir).name == folder else Path(output_dir) / folder


def _full_file(output_dir: str | os.PathLike, model_index: int, name: str = FSDP_MODEL_NAME) -> Path:
    suffix = "" if model_index == 0 else f"_{model_index}"
    return Path(output_dir) / f"{name}{suffix}.bin"


def _rank_file(output_dir: str | os.PathLike, index: int, rank: int, name: str = FSDP_MODEL_NAME, local: bool = False) -> Path:
    """Per-rank files: LOCAL_STATE_DICT's ``<name>_rank<r>.bin`` (``<name>_<i>_rank<r>.bin`` for i > 0), and sharded
    ``use_dcp=False``'s ``<name>_<i>_rank<r>.bin``."""
    middle = "" if local and index == 0 else f"_{index}"
    return Path(output_dir) / f"{name}{middle}_rank{rank}.bin"


def _save_rank_shard(state: dict, path: Path) -> None:
    """One rank's shard of a state dict (DTensors as their local tensors) with ``torch.save``."""
    torch.save(_local_tensors(state), path)


def _local_tensors(state: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {key: _local_tensors(value) for key, value in state.items()}
    if isinstance(state, list):
        return [_local_tensors(value) for value in state]
    return state.to_local() if isinstance(state, DTensor) else state


def _load_rank_shard(path: Path, template: Any) -> Any:
    """What `_save_rank_shard` wrote, with each local tensor placed like the DTensor at its place in ``template``."""
    from torch.distributed.tensor import DTensor

    def place(saved: Any, like: Any) -> Any:
        if isinstance(saved, dict):
            return {key: place(value, like.get(key) if isinstance(like, dict) else None) for key, value in saved.items()}
        if isinstance(saved, list):
            return [place(value, like[i] if isinstance(like, list) and i < len(like) else None) for i, value in enumerate(saved)]
        if isinstance(like, DTensor) and isinstance(saved, torch.Tensor):
            return DTensor.from_local(saved.to(like.device), like.device_mesh, like.placements, shape=like.shape, stride=like.stride())
        return saved

    return place(torch.load(path, map_location="cpu", weights_only=True), template)


#: The key each kind of state has inside a torch.distributed.checkpoint folder.
_DCP_KEYS = {FSDP_MODEL_NAME: "model", OPTIMIZER_NAME: "optimizer"}


def _optimizer_kind(plugin: FullyShardedDataParallelPlugin) -> str:
    """The layout an optimizer's state is written in: FULL, else SHARDED (an optimizer has no LOCAL layout)."""
    return "FULL_STATE_DICT" if _state_dict_type(plugin) == "FULL_STATE_DICT" else "SHARDED_STATE_DICT"


def _write_state(state: Any, kind: str, use_dcp: bool, accelerator: Any, output_dir: str | os.PathLike, index: int, name: str) -> None:
    """Write a model's or an optimizer's ``state`` in the layout of ``kind`` (see `save_fsdp_model`), then wait for every rank."""
    import torch.distributed.checkpoint as dcp

    if kind == "FULL_STATE_DICT":
        if accelerator.process_index == 0:
            torch.save(state, _full_file(output_dir, index, name))
    elif kind == "SHARDED_STATE_DICT" and use_dcp:
        dcp.save({_DCP_KEYS[name]: state}, checkpoint_id=_sharded_dir(output_dir, index, name))
    else:
        _save_rank_shard(state, _rank_file(output_dir, index, accelerator.process_index, name, local=kind == "LOCAL_STATE_DICT"))
    accelerator.wait_for_everyone()


def _read_state(
    kind: str, use_dcp: bool, accelerator: Any, input_dir: str | os.PathLike, index: int, name: str,
    read_full: bool, template: Callable[[], Any],
) -> Any:
    """What `_write_state` wrote: a full file (``{}`` where this rank does not ``read_full``), or this rank's shard,
    shaped like ``template()`` (this rank's current state, built only when a shard is read)."""
    import torch.distributed.checkpoint as dcp

    if kind == "FULL_STATE_DICT":
        return torch.load(_full_file(input_dir, index, name), map_location="cpu", weights_only=True) if read_full else {}
    if kind == "SHARDED_STATE_DICT" and use_dcp:
        holder = {_DCP_KEYS[name]: template()}
        dcp.load(holder, checkpoint_id=_sharded_dir(input_dir, index, name))
        return holder[_DCP_KEYS[name]]
    path = _rank_file(input_dir, index, accelerator.process_index, name, local=kind == "LOCAL_STATE_DICT")
    return _load_rank_shard(path, template())


def save_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Save an FSDP model by the plugin's ``state_dict_type``.

    Rules: FULL_STATE_DICT: the main process writes the unsharded weights to
    ``pytorch_model_fsdp.bin`` (``_<i>`` for model i > 0); LOCAL_STATE_DICT:
    every rank writes its shard to ``pytorch_model_fsdp_rank<r>.bin``;
    SHARDED_STATE_DICT: every rank writes its shard into ``pytorch_model_fsdp_<i>/``
    with torch.distributed.checkpoint, or with ``use_dcp=False`` to
    ``pytorch_model_fsdp_<i>_rank<r>.bin`` (load it with ``use_dcp=False``).
    ``adapter_only`` saves a peft model's adapter only. Collective.
    Catalog: plugin.fsdp_state_dict.
    """
    os.makedirs(output_dir, exist_ok=True)
    _full_for_processes(fsdp_plugin, accelerator)
    state = _model_state_dict(model, adapter_only, _prepare_sd_options(fsdp_plugin))
    _write_state(state, _state_dict_type(fsdp_plugin), use_dcp, accelerator, output_dir, model_index, FSDP_MODEL_NAME)


def load_fsdp_model(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike,
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> Any:
    """Load what `save_fsdp_model` wrote into the FSDP ``model`` (every rank takes its shard); returns torch's
    missing/unexpected keys. FULL_STATE_DICT on several processes: the main process reads the file and broadcasts.
    ``input_dir`` may be the sharded folder itself. Collective. Catalog: plugin.fsdp_state_dict.
    """
    accelerator.wait_for_everyone()
    _full_for_processes(fsdp_plugin, accelerator)
    options = _prepare_sd_options(fsdp_plugin)
    read_full = not options.broadcast_from_rank0 or accelerator.is_main_process
    state = _read_state(_state_dict_type(fsdp_plugin), use_dcp, accelerator, input_dir, model_index, FSDP_MODEL_NAME,
                        read_full, lambda: _model_state_dict(model, adapter_only, options))
    result = _set_model_state(model, state, adapter_only, options)
    accelerator.wait_for_everyone()
    return result


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The user's optimizer inside a prepared one (torch's state dict helpers step it to create empty state)."""
    return getattr(optimizer, "optimizer", optimizer)


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
    use_dcp: bool = True,
) -> None:
    """Save the state of an optimizer stepping the FSDP ``model``, by the plugin's ``state_dict_type``.

    Rules: FULL_STATE_DICT: the state is gathered unsharded (keyed by
    parameter name) and the main process writes ``optimizer.bin``
    (``optimizer_<i>.bin`` for i > 0); otherwise every rank writes its shard
    into ``optimizer_<i>/`` with torch.distributed.checkpoint, or with
    ``use_dcp=False`` to ``optimizer_<i>_rank<r>.bin``. Collective.
    Catalog: plugin.fsdp_state_dict.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    os.makedirs(output_dir, exist_ok=True)
    state = get_optimizer_state_dict(model, _torch_optimizer(optimizer), options=_prepare_sd_options(fsdp_plugin))
    _write_state(state, _optimizer_kind(fsdp_plugin), use_dcp, accelerator, output_dir, optimizer_index, OPTIMIZER_NAME)


def load_fsdp_optimizer(
    fsdp_plugin: FullyShardedDataParallelPlugin,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike,
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what `save_fsdp_optimizer` wrote into ``optimizer`` (every rank takes its shard of the state).

    Rules: a full state is read by the main process (every process when the
    plugin's ``optim_state_dict_config`` is not rank-0-only) and sharded like
    the model's parameters; a sharded one is read from ``optimizer_<i>/`` (or
    the per-rank files with ``use_dcp=False``). ``adapter_only`` is accepted as
    HF's (it changes nothing for the optimizer). Collective.
    Catalog: plugin.fsdp_state_dict.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    accelerator.wait_for_everyone()
    options = _prepare_sd_options(fsdp_plugin)
    inner = _torch_optimizer(optimizer)
    rank0_only = getattr(fsdp_plugin.optim_state_dict_config, "rank0_only", False)
    read_full = accelerator.process_index == 0 or not rank0_only or not options.broadcast_from_rank0
    state = _read_state(_optimizer_kind(fsdp_plugin), use_dcp, accelerator, input_dir, optimizer_index, OPTIMIZER_NAME,
                        read_full, lambda: get_optimizer_state_dict(model, inner, options=options))
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
