"""Which engine the Accelerator drives: FSDP, torch.compile, or a refusal naming what is missing.

`Accelerator.__init__` calls `resolve_engines` once; `prepare_model` calls
`prepare_with_engines`; a `DeepSpeedPlugin` (or several, by name, in
``deepspeed_plugins``) makes `prepare` go through `utils.deepspeed`. DeepSpeed (without its package), Megatron-LM and FP8
engines are refused at construction, naming the argument and the package:
where the package is not installed (ImportError), and where it is, because
this reference does not drive it yet (NotImplementedError). Never a silent
fallback to plain DDP.

Catalog: plugin.fsdp, plugin.dynamo, plugin.unavailable_engines, plugin.deepspeed_zero, plugin.deepspeed_config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .utils import imports
from .utils.dataclasses import (
    DeepSpeedPlugin,
    DynamoBackend,
    FP8RecipeKwargs,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchDynamoPlugin,
)

#: Accelerator arguments naming an engine, with the plugin class each takes.
ENGINE_ARGUMENTS = {
    "deepspeed_plugin": DeepSpeedPlugin,
    "deepspeed_plugins": dict,
    "fsdp_plugin": FullyShardedDataParallelPlugin,
    "megatron_lm_plugin": MegatronLMPlugin,
    "torch_tp_plugin": object,
    "parallelism_config": object,
}

#: Engine argument -> (package import name, pip name, availability check).
_ENGINE_PACKAGES = {
    "deepspeed_plugin": ("deepspeed", "deepspeed", imports.is_deepspeed_available),
    "deepspeed_plugins": ("deepspeed", "deepspeed", imports.is_deepspeed_available),
    "megatron_lm_plugin": ("megatron", "megatron-core", imports.is_megatron_lm_available),
}

_FP8_CHECKS = {"TE": imports.is_transformer_engine_available, "MSAMP": imports.is_msamp_available, "AO": imports.is_torchao_available}


@dataclass
class Engines:
    """The engines one Accelerator drives."""

    fsdp_plugin: Optional[FullyShardedDataParallelPlugin]
    dynamo_plugin: TorchDynamoPlugin
    #: ``deepspeed_plugin`` or the ``deepspeed_plugins`` dict when DeepSpeed drives training (`utils.deepspeed`).
    deepspeed_plugins: Any = None
    #: The parameters sharding replaced, by the replaced parameter's id.
    replaced_parameters: dict[int, torch.nn.Parameter] = field(default_factory=dict)

    def switch_optimizer_parameters(self, optimizer: torch.optim.Optimizer) -> None:
        """Point ``optimizer``'s parameter groups at the sharded parameters that replaced theirs.

        Rule: FSDP's ``fully_shard`` registers new (DTensor) parameters, so an
        optimizer built on the model before `prepare` would step stale
        tensors. Catalog: plugin.fsdp.
        """
        for group in optimizer.param_groups:
            group["params"] = [self.replaced_parameters.get(id(p), p) for p in group["params"]]


def resolve_engines(
    engines: dict[str, Any],
    mixed_precision: Optional[str],
    handlers: dict[type, Any],
    dynamo_backend: Any,
    dynamo_plugin: Optional[TorchDynamoPlugin],
) -> Engines:
    """Validate the engine arguments of `Accelerator(...)`; refuse what cannot run, naming it.

    Rules: an unknown keyword is a TypeError; a plugin of the wrong type a
    TypeError naming the argument; more than one of ``fsdp_plugin``,
    ``deepspeed_plugin(s)``, ``megatron_lm_plugin`` a ValueError naming
    them; DeepSpeed/Megatron-LM refused as the module docstring says;
    ``mixed_precision="fp8"`` with an `FP8RecipeKwargs` refused naming its
    backend's package; ``dynamo_backend`` and ``dynamo_plugin`` together a ValueError.
    Catalog: plugin.unavailable_engines, plugin.dynamo.
    """
    unknown = sorted(set(engines) - set(ENGINE_ARGUMENTS))
    if unknown:
        raise TypeError(f"Accelerator() got unexpected keyword argument(s): {', '.join(unknown)}")
    given = {name: value for name, value in engines.items() if value is not None}
    for name, value in given.items():
        if not isinstance(value, ENGINE_ARGUMENTS[name]):
            raise TypeError(f"{name} must be a {ENGINE_ARGUMENTS[name].__name__}, got {type(value).__name__}")
    exclusive = sorted(set(given) & {"fsdp_plugin", "deepspeed_plugin", "deepspeed_plugins", "megatron_lm_plugin"})
    if len(exclusive) > 1:
        raise ValueError(f"Pass only one engine plugin; got {', '.join(exclusive)}")
    for name in given:
        if name in _ENGINE_PACKAGES:
            module, pip_name, available = _ENGINE_PACKAGES[name]
            if not available():
                raise ImportError(f"{name} needs the `{module}` package, which is not installed (pip install {pip_name})")
            if not name.startswith("deepspeed_plugin"):  # `utils.deepspeed` drives DeepSpeed
                raise NotImplementedError(f"{name}: accelerate_ref does not drive {module} yet (it is installed)")
    if "torch_tp_plugin" in given:
        raise NotImplementedError("torch_tp_plugin: accelerate_ref does not provide tensor parallelism yet")
    if str(mixed_precision).lower() == "fp8" and handlers.get(FP8RecipeKwargs) is not None:
        _refuse_fp8(handlers[FP8RecipeKwargs])  # without a recipe, `precision.MixedPrecision` refuses naming every engine
    if dynamo_backend is not None and dynamo_plugin is not None:
        raise ValueError("You cannot pass in both `dynamo_plugin` and `dynamo_backend`, please only pass in one.")
    if dynamo_plugin is None:
        dynamo_plugin = TorchDynamoPlugin(backend=dynamo_backend)
    fsdp_plugin = given.get("fsdp_plugin")
    if fsdp_plugin is not None and mixed_precision in ("fp16", "bf16"):
        fsdp_plugin.set_mixed_precision(mixed_precision)
    return Engines(fsdp_plugin=fsdp_plugin, dynamo_plugin=dynamo_plugin, deepspeed_plugins=_deepspeed_plugins(given))


def _deepspeed_plugins(given: dict[str, Any]) -> Any:
    """``deepspeed_plugin`` or ``deepspeed_plugins`` as given, the (first) plugin selected; None without DeepSpeed.

    Rules (HF's): every value of ``deepspeed_plugins`` is a `DeepSpeedPlugin`
    (TypeError) and there is at least one; the first is the active one until
    `AcceleratorState.select_deepspeed_plugin` picks another.
    Catalog: plugin.deepspeed_config.
    """
    plugins = given.get("deepspeed_plugin", given.get("deepspeed_plugins"))
    if plugins is None:
        return None
    if isinstance(plugins, dict):
        if not plugins or not all(isinstance(plugin, DeepSpeedPlugin) for plugin in plugins.values()):
            raise TypeError("deepspeed_plugins must map names to DeepSpeedPlugin objects (at least one)")
        for plugin in plugins.values():
            plugin._unselect()
    first = next(iter(plugins.values())) if isinstance(plugins, dict) else plugins
    first.select(_from_accelerator_state=True)
    return plugins


def _refuse_fp8(recipe: FP8RecipeKwargs) -> None:
    if not _FP8_CHECKS[recipe.backend]():
        raise ImportError(
            f"mixed_precision='fp8' with the {recipe.backend} backend needs the `{recipe.package}` package, "
            "which is not installed (FP8RecipeKwargs(backend=...) picks TE, MSAMP or AO)"
        )
    raise NotImplementedError(f"mixed_precision='fp8': accelerate_ref does not drive {recipe.package} yet")


def prepare_with_engines(model: torch.nn.Module, engines: Engines, state: Any, distributed: bool) -> Optional[torch.nn.Module]:
    """``model`` sharded with FSDP when a plugin was given and several processes train, else None (use DDP).

    Catalog: plugin.fsdp.
    """
    if engines.fsdp_plugin is None or not distributed:
        return None
    from .utils.fsdp_utils import shard_model

    model, replaced = shard_model(model, engines.fsdp_plugin, state)
    engines.replaced_parameters.update(replaced)
    return model


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``torch.compile(model, **plugin.to_kwargs())`` unless the backend is NO or it is compiled already.

    Catalog: plugin.dynamo.
    """
    if plugin.backend == DynamoBackend.NO or isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return model
    return torch.compile(model, **plugin.to_kwargs())
