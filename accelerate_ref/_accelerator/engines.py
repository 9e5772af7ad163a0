"""Which engine the Accelerator drives: FSDP, torch.compile, or a refusal naming what is missing.

`Accelerator.__init__` calls `resolve_engines` once; `prepare_model` calls
`prepare_with_engines`; a `DeepSpeedPlugin` (or several, by name, in
``deepspeed_plugins``) makes `prepare` go through `utils.deepspeed`. DeepSpeed (without its package), Megatron-LM and FP8
engines are refused at construction, naming the argument and the package:
where the package is not installed (ImportError), and where it is, because
this reference does not drive it yet (NotImplementedError); so is a
``torch_tp_plugin`` asking for tensor parallelism (``tp_size`` > 1). Never a
silent fallback to plain DDP. `compile_model` compiles the prepared model
(whole, or region by region with ``use_regional_compilation``).

Catalog: plugin.fsdp, plugin.dynamo, plugin.unavailable_engines, plugin.deepspeed_zero, plugin.deepspeed_config.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..utils import imports
from ..utils._dataclasses.fsdp import MIXED_PRECISION_DTYPES
from ..utils.dataclasses import (
    DeepSpeedPlugin,
    DynamoBackend,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    TorchDynamoPlugin,
    TorchTensorParallelPlugin,
)
from ..utils._dataclasses.low_precision import FP8_BACKEND_PACKAGES, FP8_RECIPE_CLASSES, FP8BackendType, fp8_backend_of

#: The Accelerator's keyword arguments naming an engine.
#: The plugins of which one engine drives training.
ENGINE_PLUGINS = ("fsdp_plugin", "deepspeed_plugin", "deepspeed_plugins", "megatron_lm_plugin")
ENGINE_ARGUMENTS = ("deepspeed_plugin", "deepspeed_plugins", "fsdp_plugin", "megatron_lm_plugin", "torch_tp_plugin",
                    "parallelism_config")

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

    Rules, in HF 1.15's order and words: an unknown keyword is Python's
    TypeError; ``dynamo_backend`` with ``dynamo_plugin`` a ValueError;
    ``deepspeed_plugin`` with ``deepspeed_plugins`` a ValueError; a
    ``deepspeed_plugins`` dict with a value that is not a `DeepSpeedPlugin`
    a TypeError; DeepSpeed without its package an ImportError; an
    ``fsdp_plugin`` or ``megatron_lm_plugin`` of another type a TypeError.
    Then the reference's own rule: more than one of ``fsdp_plugin``,
    ``deepspeed_plugin(s)``, ``megatron_lm_plugin`` is a ValueError naming
    them (catalog plugin.unavailable_engines). Megatron-LM is an ImportError
    without its package (HF's words), NotImplementedError with it (the
    module docstring); ``mixed_precision="fp8"`` with an FP8 recipe handler
    is refused naming its backend's package, a recipe handler without fp8
    (and without FSDP or DeepSpeed) is HF's ValueError. Without an engine
    plugin, ``ACCELERATE_USE_DEEPSPEED=true`` (what ``launch --use_deepspeed``
    or a config's DEEPSPEED sets) makes a `DeepSpeedPlugin` from the
    ``ACCELERATE_DEEPSPEED_*`` variables and ``ACCELERATE_USE_FSDP=true``
    (``launch --use_fsdp``) a `FullyShardedDataParallelPlugin` from the
    ``FSDP_*`` variables, as HF does; unlike HF, a given plugin does not set
    ``ACCELERATE_USE_FSDP`` in this process's environment (HF's write leaks
    FSDP into every later `Accelerator` of the process).
    Catalog: plugin.unavailable_engines, plugin.dynamo, plugin.fsdp.
    """
    unknown = [name for name in engines if name not in ENGINE_ARGUMENTS]
    if unknown:
        raise TypeError(f"Accelerator.__init__() got an unexpected keyword argument '{unknown[0]}'")  # Python's words
    if dynamo_backend is not None and dynamo_plugin is not None:
        raise ValueError("You cannot pass in both `dynamo_plugin` and `dynamo_backend`, please only pass in one.")
    given = {name: value for name, value in engines.items() if value is not None}
    if not set(given) & set(ENGINE_PLUGINS) and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        given["deepspeed_plugin"] = DeepSpeedPlugin()  # a launch's DeepSpeed options, as HF builds it
    _check_engine_arguments(given)
    exclusive = sorted(set(given) & set(ENGINE_PLUGINS))
    if len(exclusive) > 1:
        raise ValueError(f"Pass only one engine plugin; got {', '.join(exclusive)}")
    if "megatron_lm_plugin" in given:
        if not imports.is_megatron_lm_available():
            raise ImportError("Megatron is not installed. please build it from source.")
        raise NotImplementedError("megatron_lm_plugin: accelerate_ref does not drive megatron yet (it is installed)")
    if "torch_tp_plugin" in given:
        _check_tensor_parallel(given["torch_tp_plugin"])
    # The precision the state will run (the launcher's environment when none is given).
    precision = str(mixed_precision if mixed_precision is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")).lower()
    if any(handlers.get(recipe) is not None for recipe in FP8_RECIPE_CLASSES):
        if precision == "fp8":
            _refuse_fp8(fp8_backend_of(handlers))  # without a recipe, `precision.MixedPrecision` refuses naming every engine
        if not exclusive:  # HF's rule and words (FSDP and DeepSpeed take the recipe in their own precision)
            raise ValueError("Passing in an FP8 configuration requires setting `mixed_precision='fp8'`.")
    if dynamo_plugin is None:
        dynamo_plugin = TorchDynamoPlugin(backend=dynamo_backend)
    fsdp_plugin = given.get("fsdp_plugin")
    if fsdp_plugin is None and not exclusive and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        fsdp_plugin = FullyShardedDataParallelPlugin()  # a launch's FSDP options (its FSDP_* variables), as HF builds it
    if fsdp_plugin is not None and precision in MIXED_PRECISION_DTYPES:  # HF's rule: any precision but "no" (fp8: bf16)
        fsdp_plugin.set_mixed_precision(precision)
    deepspeed_plugins = _deepspeed_plugins(given, mixed_precision)
    return Engines(fsdp_plugin=fsdp_plugin, dynamo_plugin=dynamo_plugin, deepspeed_plugins=deepspeed_plugins)


def _check_engine_arguments(given: dict[str, Any]) -> None:
    """HF 1.15's checks of the engine plugins' types and of DeepSpeed's package, in its order and words."""
    if "deepspeed_plugin" in given and "deepspeed_plugins" in given:
        raise ValueError("You cannot pass in both `deepspeed_plugins` and `deepspeed_plugin`.")
    deepspeed = given.get("deepspeed_plugin", given.get("deepspeed_plugins"))
    if deepspeed is not None:
        plugins = deepspeed.values() if isinstance(deepspeed, dict) else ()
        if not all(isinstance(plugin, DeepSpeedPlugin) for plugin in plugins):
            raise TypeError("`deepspeed_plugin` must be a DeepSpeedPlugin object.")
        if not imports.is_deepspeed_available():
            raise ImportError("DeepSpeed is not installed => run `pip install deepspeed` or build it from source.")
        if not isinstance(deepspeed, (dict, DeepSpeedPlugin)):
            raise TypeError("`deepspeed_plugin` must be a DeepSpeedPlugin object.")
    if "fsdp_plugin" in given and not isinstance(given["fsdp_plugin"], FullyShardedDataParallelPlugin):
        raise TypeError("`fsdp_plugin` must be a FullyShardedDataParallelPlugin object.")
    if "megatron_lm_plugin" in given and not isinstance(given["megatron_lm_plugin"], MegatronLMPlugin):
        raise TypeError("`megatron_lm_plugin` must be a MegatronLMPlugin object.")
    tp_plugin = given.get("torch_tp_plugin")
    if tp_plugin is not None and not isinstance(tp_plugin, TorchTensorParallelPlugin):
        raise TypeError(f"torch_tp_plugin must be a TorchTensorParallelPlugin, got {type(tp_plugin).__name__}")


def _deepspeed_plugins(given: dict[str, Any], mixed_precision: Optional[str]) -> Any:
    """``deepspeed_plugin`` or ``deepspeed_plugins`` as given, the (first) plugin selected; None without DeepSpeed.

    Rules (HF's): every value of ``deepspeed_plugins`` is a `DeepSpeedPlugin`
    (TypeError) and there is at least one; each takes the Accelerator's mixed
    precision (`DeepSpeedPlugin.set_mixed_precision`); the first is the active
    one until `AcceleratorState.select_deepspeed_plugin` picks another. A plugin
    with ``enable_msamp`` is refused (`utils._dataclasses.deepspeed.refuse_msamp`).
    Catalog: plugin.deepspeed_config, plugin.unavailable_engines.
    """
    plugins = given.get("deepspeed_plugin", given.get("deepspeed_plugins"))
    if plugins is None:
        return None
    if isinstance(plugins, dict):
        if not plugins:
            raise TypeError("deepspeed_plugins must map names to DeepSpeedPlugin objects (at least one)")
        for plugin in plugins.values():
            plugin._unselect()
    from ..state import requested_precision
    from ..utils._dataclasses.deepspeed import refuse_msamp

    for plugin in plugins.values() if isinstance(plugins, dict) else [plugins]:
        refuse_msamp(plugin)
        plugin.set_mixed_precision(requested_precision(mixed_precision))
    first = next(iter(plugins.values())) if isinstance(plugins, dict) else plugins
    first.select(_from_accelerator_state=True)
    return plugins


def _check_tensor_parallel(plugin: TorchTensorParallelPlugin) -> None:
    """Warn as HF 1.15 does (the plugin is deprecated); refuse a ``tp_size`` above 1, which would shard the model.

    Catalog: plugin.unavailable_engines.
    """
    warnings.warn(
        "`TorchTensorParallelPlugin` is deprecated and will be removed in a future version of Accelerate. "
        "Please use the `ParallelismConfig` with `tp_size` instead.",
        FutureWarning,
        stacklevel=4,
    )
    if plugin.tp_size > 1:
        raise NotImplementedError(
            f"torch_tp_plugin: tp_size={plugin.tp_size} needs tensor parallelism (HF's ParallelismConfig and a "
            "Transformers model loaded with tp_plan), which accelerate_ref does not provide; tp_size=1 runs without it"
        )


def _refuse_fp8(backend: FP8BackendType) -> None:
    package = FP8_BACKEND_PACKAGES[backend.value]
    if not _FP8_CHECKS[backend.value]():
        raise ImportError(
            f"mixed_precision='fp8' with the {backend.value} backend needs the `{package}` package, "
            "which is not installed (the FP8 recipe handler picks the backend)"
        )
    raise NotImplementedError(f"mixed_precision='fp8': accelerate_ref does not drive {package} yet")


def prepare_with_engines(model: torch.nn.Module, engines: Engines, state: Any, distributed: bool) -> Optional[torch.nn.Module]:
    """``model`` sharded with FSDP when a plugin was given and several processes train, else None (use DDP).

    Catalog: plugin.fsdp.
    """
    if engines.fsdp_plugin is None or not distributed:
        return None
    from ..utils.fsdp_utils import shard_model

    model, replaced = shard_model(model, engines.fsdp_plugin, state)
    engines.replaced_parameters.update(replaced)
    return model


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``torch.compile(model, **plugin.to_kwargs())`` unless the backend is NO or it is compiled already.

    Rule: with ``plugin.use_regional_compilation``, `utils.other.compile_regions`
    instead (each repeated block compiled on its own); on a model FSDP2
    sharded, its in-place variant `compile_regions_fsdp2`, so the hooks
    ``fully_shard`` registered keep running. Catalog: plugin.dynamo.
    """
    if plugin.backend == DynamoBackend.NO or isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return model
    if not plugin.use_regional_compilation:
        return torch.compile(model, **plugin.to_kwargs())
    from torch.distributed.fsdp import FSDPModule

    from ..utils.other import compile_regions, compile_regions_fsdp2

    regional = compile_regions_fsdp2 if isinstance(model, FSDPModule) else compile_regions
    return regional(model, **plugin.to_kwargs())


class EnginesMixin:
    """The `Accelerator`'s engine-facing attributes: the active DeepSpeed plugin, FSDP2, the FP8 backend,
    Ulysses loaders, LOMO.

    Uses the Accelerator's ``state``. Catalog: plugin.deepspeed_config, plugin.fsdp.
    """

    @property
    def deepspeed_plugin(self) -> Any:
        """The active `DeepSpeedPlugin` (``state.select_deepspeed_plugin`` picks one of several), or None."""
        return self.state.deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        """Whether FSDP drives the model with ``fsdp_version=2`` (HF's property)."""
        return self.state.is_fsdp2

    @property
    def fp8_backend(self) -> Any:
        """The FP8 backend (an `FP8BackendType`), by HF's rule: see `utils.low_precision.fp8_backend_of`."""
        from ..utils._dataclasses.low_precision import fp8_backend_of

        return fp8_backend_of(self.kwargs_handlers, self.deepspeed_plugin)

    def deepspeed_ulysses_dl_adapter(self, dl: Any, model: Any) -> Any:
        """``dl`` sharded along the sequence for DeepSpeed's Ulysses (`utils.deepspeed.deepspeed_ulysses_dl_adapter`)."""
        from ..utils.deepspeed import deepspeed_ulysses_dl_adapter

        return deepspeed_ulysses_dl_adapter(self, dl, model)

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Backward and update through the prepared LOMO optimizers (`lomo.lomo_backward`). Catalog: backward.loss."""
        from .lomo import lomo_backward

        lomo_backward(self._optimizers, loss, learning_rate)
