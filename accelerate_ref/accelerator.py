"""The `Accelerator`: one object a training script talks to.

This module holds the constructor, the topology attributes, process control,
the collective methods and the training path (prepare, backward,
accumulation, clipping, mixed precision). Each method states the documented
rule it implements and the catalog ID that checks it; the mechanics live in
`_accelerator.precision` (autocast, scaler), `_accelerator.gradient_sync` (DDP synchronisation, uneven
inputs), `optimizer`, `scheduler` and `utils.other` / `utils.memory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

from ._accelerator import gradient_sync, lomo, quantized
from .data_loader import prepare_data_loader, skip_first_batches
from .optimizer import AcceleratedOptimizer
from ._accelerator.parallelism import ParallelismMixin
from ._accelerator.precision import MixedPrecision
from ._accelerator.process_control import ProcessControlMixin
from ._accelerator.checkpointing import CheckpointingMixin
from .scheduler import AcceleratedScheduler
from .parallelism_config import ParallelismConfig
from .state import AcceleratorState, GradientState
from .tracking import LOGGER_TYPE_TO_CLASS, TrackingMixin  # noqa: F401  (HF's accelerator module exposes LOGGER_TYPE_TO_CLASS)
from .utils.constants import DTENSOR_PYTORCH_VERSION, PROFILE_PATTERN_NAME  # noqa: F401  (HF's module exposes DTENSOR_...)
from .utils.constants import FSDP2_PYTORCH_VERSION, FSDP_PYTORCH_VERSION  # noqa: F401  (HF's accelerator module exposes them)
from .utils.constants import (  # noqa: F401  (HF's accelerator module exposes these file names)
    MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SCALER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)
from .utils.dataclasses import (
    ACCELERATOR_WORLD_TYPES,
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
)
from .utils._dataclasses.low_precision import FP8_RECIPE_CLASSES, AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from ._accelerator.engines import EnginesMixin, compile_model, prepare_with_engines, resolve_engines
from .logging import get_logger
from .utils.imports import is_bitsandbytes_multi_backend_available, is_xpu_available  # looked up here: HF's tests patch them here
from .utils.memory import release_memory
from .utils.other import extract_model_from_parallel, has_device_map

logger = get_logger(__name__)

#: The handlers `kwargs_handlers` takes, with the Accelerator attribute each lands in (HF 1.15's names).
HANDLER_ATTRIBUTES = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    FP8RecipeKwargs: "fp8_recipe_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
}

#: The v0.27 constructor keywords that `DataLoaderConfiguration` replaced (catalog compat.v027_dataloader_kwargs).
V027_DATALOADER_KEYWORDS = ("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler")
#: The default of `split_batches`: tells "not passed" from any value (HF uses such a sentinel too).
_NOT_GIVEN: Any = object()


def _dataloader_configuration(config: DataLoaderConfiguration | None, legacy: dict[str, Any]) -> DataLoaderConfiguration:
    """The constructor's `DataLoaderConfiguration`, v0.27's keywords included.

    Rule: the keywords of v0.27 (`V027_DATALOADER_KEYWORDS`) still configure
    the prepared loaders as documented there, with a FutureWarning naming
    `DataLoaderConfiguration`; given together with ``dataloader_config`` they
    are a ValueError. Catalog: compat.v027_dataloader_kwargs.
    """
    given = {name: value for name, value in legacy.items() if value is not _NOT_GIVEN}
    if not given:
        return config or DataLoaderConfiguration()
    if config is not None:
        raise ValueError(f"Pass either `dataloader_config` or the deprecated keywords {sorted(given)}, not both")
    values = ", ".join(f"{name}={value!r}" for name, value in given.items())
    warnings.warn(
        f"Passing {', '.join(given)} to `Accelerator` is deprecated (the v0.27 keywords): pass an "
        f"`accelerate.DataLoaderConfiguration` instead: dataloader_config = DataLoaderConfiguration({values})",
        FutureWarning,
        stacklevel=3,
    )
    return DataLoaderConfiguration(**given)


class Accelerator(ProcessControlMixin, CheckpointingMixin, TrackingMixin, EnginesMixin, ParallelismMixin):
    """Creates the process state and exposes process control and collectives.

    Attributes (catalog ``state.attributes``): ``device``,
    ``distributed_type``, ``local_process_index``, ``mixed_precision``,
    ``num_processes``, ``process_index``, ``state``, ``sync_gradients``,
    ``use_distributed``, ``is_main_process``, ``is_local_main_process``,
    ``is_last_process``.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = _NOT_GIVEN,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        **v027_keywords: Any,
    ) -> None:
        if mixed_precision is not None:
            mixed_precision = str(mixed_precision)
            if mixed_precision not in PrecisionType:  # HF's check and words: the name as given, lower-case
                raise ValueError(
                    f"Unknown mixed_precision mode: {mixed_precision}. Choose between {PrecisionType.list()}"
                )
        legacy = {name: v027_keywords.pop(name, _NOT_GIVEN) for name in V027_DATALOADER_KEYWORDS[1:]}
        dataloader_config = _dataloader_configuration(dataloader_config, {"split_batches": split_batches, **legacy})
        engines = dict(deepspeed_plugin=deepspeed_plugin, fsdp_plugin=fsdp_plugin, torch_tp_plugin=torch_tp_plugin,
                       megatron_lm_plugin=megatron_lm_plugin, deepspeed_plugins=deepspeed_plugins,
                       parallelism_config=parallelism_config, **v027_keywords)  # what is left of those: unknown
        handlers = _index_handlers(kwargs_handlers or [])
        self._engines = resolve_engines(engines, mixed_precision, handlers, dynamo_backend, dynamo_plugin)
        if gradient_accumulation_plugin is not None and gradient_accumulation_steps != 1:
            raise ValueError(  # HF's words; catalog accumulate.plugin
                "You can only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`. "
                "Please only pass in the created `GradientAccumulationPlugin` object."
            )
        init_kwargs = handlers.get(InitProcessGroupKwargs)
        self.state = AcceleratorState(
            mixed_precision=mixed_precision,
            cpu=cpu,
            dynamo_plugin=self._engines.dynamo_plugin,
            fsdp_plugin=self._engines.fsdp_plugin,
            deepspeed_plugin=self._engines.deepspeed_plugins,
            _from_accelerator=True,
            **(init_kwargs.to_kwargs() if init_kwargs else {}),
        )
        self.state.deepspeed_plugins = self._engines.deepspeed_plugins  # the latest Accelerator's plugins
        if self._engines.fsdp_plugin is not None:
            self.state.fsdp_plugin = self._engines.fsdp_plugin
        if self._engines.deepspeed_plugins is not None:
            #: The DeepSpeed engine's wrapper once `prepare` handed a model to DeepSpeed (as HF names it).
            self.deepspeed_engine_wrapped: Any = None
        if parallelism_config is None and torch_tp_plugin is not None:  # HF: the deprecated plugin's tp_size
            parallelism_config = ParallelismConfig(tp_size=torch_tp_plugin.tp_size)
        self._init_parallelism(parallelism_config)  # its device mesh (`parallelism`)
        if gradient_accumulation_plugin is None:
            steps = int(os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", gradient_accumulation_steps))
            gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)
        self.gradient_state = GradientState(gradient_accumulation_plugin)
        self.device_placement = device_placement
        self.dataloader_config = dataloader_config
        self.project_configuration = project_config or ProjectConfiguration(project_dir=project_dir)
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)  # as HF: the argument fills the config's
        self.rng_types = list(rng_types) if rng_types is not None else ["generator"]
        self.log_with = log_with
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.dynamo_backend = dynamo_backend
        self.kwargs_handlers = handlers
        for handler_class, attribute in HANDLER_ATTRIBUTES.items():  # HF's attribute names, None when not given
            setattr(self, attribute, handlers.get(handler_class))
        self.has_fp8_handler = any(handlers.get(recipe) is not None for recipe in FP8_RECIPE_CLASSES)
        self.fp8_enabled = self.mixed_precision == "fp8"
        self.delayed_fp8_autocast = False
        self.has_lomo_optimizer = False
        self.flag_tensor: torch.Tensor | None = None
        self._precision = MixedPrecision(self.mixed_precision, self.device, self.autocast_handler, self.scaler_handler)
        #: The fp16 gradient scaler (None otherwise) and whether forwards autocast, as HF names them.
        self.scaler = self._precision.scaler
        self.native_amp = self._precision.native_amp
        #: Calls of `accumulate` since the last synchronised step (reset by `free_memory`).
        self.step = 0
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[Any] = []

    def __deepcopy__(self, memo: dict) -> "Accelerator":
        """A deep copy is the Accelerator itself (HF 1.15, with its info log): one process has one Accelerator."""
        logger.info("Deep copying the `Accelerator` object, note that this will point to the same original object.")
        return self

    # -- topology (catalog state.attributes) -----------------------------

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, sync_gradients: bool) -> None:
        self.gradient_state.sync_gradients = sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, gradient_accumulation_steps: int) -> None:
        """Batches per optimizer update from now on (the gradient state's settings). Catalog: accumulate.plugin."""
        self.gradient_state.plugin_kwargs.update({"num_steps": gradient_accumulation_steps})

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        """``even_batches`` of the `DataLoaderConfiguration`; setting it changes the loaders prepared after.

        Catalog: join.uneven_inputs.
        """
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def dispatch_batches(self) -> bool | None:
        """``dispatch_batches`` of the `DataLoaderConfiguration`. Catalog: data.dispatch_batches."""
        return self.dataloader_config.dispatch_batches

    @property
    def use_seedable_sampler(self) -> bool:
        """``use_seedable_sampler`` of the `DataLoaderConfiguration`. Catalog: data.seedable_sampler."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """``non_blocking`` of the `DataLoaderConfiguration` (batches moved to the device asynchronously)."""
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        """``use_stateful_dataloader`` of the `DataLoaderConfiguration`."""
        return self.dataloader_config.use_stateful_dataloader

    @property
    def multi_device(self) -> bool:
        """Whether this run is distributed over several accelerator devices (not CPU or XLA ranks), as HF 1.15."""
        return self.use_distributed and self.distributed_type in ACCELERATOR_WORLD_TYPES

    @property
    def should_save_model(self) -> bool:
        """Whether this process should write the model (a hint for training loops; `save_model` does not read
        it): the local main process without a ParallelismConfig, every process with one (HF 1.15's answer)."""
        return self.parallelism_config is not None or self.state.is_local_main_process

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer update was skipped because fp16 gradients overflowed.

        Catalog: autocast.fp16_scaler.
        """
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    # -- prepare -------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: Sequence[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers; return them in the same order.

        Rules: each object goes to its ``prepare_*`` method (schedulers after
        every optimizer of the call, so a scheduler finds its optimizer in
        the same call); an object of any other type comes back unchanged.
        ``device_placement`` gives one flag per object (``[True, True,
        False, False]`` places only the first two) and must be as long as
        ``args``. One object comes back alone, several as a tuple.
        With a `DeepSpeedPlugin` the model and its optimizer go to
        ``deepspeed.initialize`` together (`utils.deepspeed.prepare_deepspeed`).
        Catalog: prepare.order, prepare.device_placement_list, prepare.verify_device_map,
        plugin.deepspeed_zero.

        Refusals (HF 1.15's words): ``device_placement`` with DeepSpeed, or
        not as long as ``args`` (``len`` of it: Python's TypeError for a
        bool); a model dispatched with a device map when several processes
        train (`_refuse_dispatched`). ``prepare()`` with nothing is HF's
        IndexError.
        """
        if device_placement is None:
            flags = [None] * len(args)
        elif self._engines.deepspeed_plugins is not None:
            raise ValueError("You can't customize device placements with DeepSpeed or Megatron-LM.")
        elif len(device_placement) != len(args):
            raise ValueError(
                f"`device_placement` should be a list with {len(args)} elements (the number of objects passed)."
            )
        else:
            flags = list(device_placement)
        for obj in args:
            if isinstance(obj, torch.nn.Module):
                self._refuse_dispatched(obj)
        if self._engines.deepspeed_plugins is not None:
            from .utils.deepspeed import prepare_deepspeed

            prepared = prepare_deepspeed(self, list(args))
            return prepared[0] if len(prepared) == 1 else tuple(prepared)
        first_pass = [self._prepare_one(obj, flag) for obj, flag in zip(args, flags)]
        scheduler_type = torch.optim.lr_scheduler.LRScheduler
        prepared = tuple(self.prepare_scheduler(obj) if isinstance(obj, scheduler_type) else obj for obj in first_pass)
        return prepared if len(prepared) > 1 else prepared[0]

    def _refuse_dispatched(self, model: torch.nn.Module) -> None:
        """A model dispatched over several devices with a device map cannot be trained by several processes
        (HF's ValueError), unless ``ACCELERATE_BYPASS_DEVICE_MAP=true``. Catalog: prepare.verify_device_map."""
        if (self.use_distributed and self.verify_device_map(model)
                and os.environ.get("ACCELERATE_BYPASS_DEVICE_MAP", "false") != "true"):
            raise ValueError(
                "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode. "
                "Please rerun your script specifying `--num_processes=1` or by launching with "
                "`python {{myscript.py}}`."
            )

    def _check_quantized_placement(self, model: torch.nn.Module) -> bool:
        """`quantized.check_placement` with this module's availability checks (HF's tests patch them here)."""
        return quantized.check_placement(model, self.device, self.distributed_type,
                                         multi_backend=is_bitsandbytes_multi_backend_available, xpu=is_xpu_available)

    def _prepare_one(self, obj: Any, device_placement: bool | None) -> Any:
        """The first pass of `prepare`: loaders, models and optimizers; anything else unchanged."""
        if isinstance(obj, torch.utils.data.DataLoader):
            return self.prepare_data_loader(obj, device_placement=device_placement)
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=device_placement)
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, device_placement=device_placement)
        return obj

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Prepare one model: place it, apply mixed precision, wrap it for distributed training.

        Rules: moved to `device` when ``device_placement`` (default: the
        Accelerator's); its forward autocasts under mixed precision; unless
        ``evaluation_mode``, wrapped in ``DistributedDataParallel`` (with the
        `DistributedDataParallelKwargs` handler's arguments) when several
        processes train and it has trainable parameters. A model dispatched
        over several devices with a device map cannot be trained by several
        processes: ValueError; a bitsandbytes 8-bit or 4-bit model with a map
        is checked and never moved (`_check_quantized_placement`). A model
        prepared before comes back as it is.
        As HF 1.15, the Accelerator remembers (in ``_models``, what
        `save_state` saves) the user's module itself, or its FSDP wrapper;
        not the DDP wrapper or the compiled module around it.
        Catalog: prepare.single_methods, prepare.unwrap, prepare.evaluation_mode,
        prepare.verify_device_map, kwargs.ddp, autocast.bf16, plugin.fsdp (an
        `fsdp_plugin` shards instead of DDP), plugin.dynamo (compiled last).
        """
        if getattr(model, "_is_accelerate_prepared", False):
            return _remember(self._models, model)
        self._models.append(model)
        self._refuse_dispatched(model)
        placement = device_placement if device_placement is not None else self.device_placement
        quantized_with_map = self._check_quantized_placement(model)
        if placement and not quantized_with_map and not self.verify_device_map(model):  # a dispatched model stays put
            model = self._models[-1] = self.state.family.move_module(model, self.device)
        self._precision.wrap_forward(model)
        if not evaluation_mode and self.use_distributed:
            sharded = prepare_with_engines(model, self._engines, self.state, self.use_distributed)
            if sharded is not None:
                model = self._models[-1] = sharded
            else:
                model = gradient_sync.wrap_for_data_parallel(model, self.device, self.ddp_handler)
        model = compile_model(model, self._engines.dynamo_plugin)
        model._is_accelerate_prepared = True
        return model

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap an optimizer so that it steps only on synchronised steps (through the scaler under fp16).

        Catalog: prepare.single_methods, accumulate.doc_example, autocast.fp16_scaler.
        """
        self.has_lomo_optimizer |= lomo.is_lomo_optimizer(optimizer)
        if getattr(optimizer, "_is_accelerate_prepared", False):
            return _remember(self._optimizers, optimizer)
        placement = device_placement if device_placement is not None else self.device_placement
        self._engines.switch_optimizer_parameters(optimizer)
        prepared = AcceleratedOptimizer(optimizer, device_placement=placement, scaler=self.scaler)
        prepared._is_accelerate_prepared = True
        return _remember(self._optimizers, prepared)

    def prepare_scheduler(self, scheduler: torch.optim.lr_scheduler.LRScheduler) -> AcceleratedScheduler:
        """Wrap a scheduler so that it steps with its optimizer's real updates.

        Rule (HF 1.15): it follows the prepared optimizer wrapping its own
        optimizer (prepared before, or in the same `prepare` call); when none
        does, every optimizer prepared so far (a step skipped by any of them
        is skipped).
        Catalog: prepare.single_methods, accumulate.scheduler.
        """
        if getattr(scheduler, "_is_accelerate_prepared", False):
            return _remember(self._schedulers, scheduler)
        owner = getattr(scheduler, "optimizer", None)
        optimizer = next((o for o in self._optimizers if owner == o.optimizer), self._optimizers)
        prepared = AcceleratedScheduler(
            scheduler,
            optimizer,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        prepared._is_accelerate_prepared = True
        return _remember(self._schedulers, prepared)

    def prepare_data_loader(
        self,
        data_loader: torch.utils.data.DataLoader,
        device_placement: bool | None = None,
        slice_fn_for_dispatch: Callable[..., Any] | None = None,
    ) -> Any:
        """Shard a data loader over the processes with the Accelerator's `DataLoaderConfiguration`.

        Rule: see `accelerate_ref.data_loader.prepare_data_loader`; batches go
        to `device` when ``device_placement`` (default: the Accelerator's).
        Catalog: prepare.single_methods, data.*.
        """
        if getattr(data_loader, "_is_accelerate_prepared", False):
            return _remember(self._dataloaders, data_loader)
        config = self.dataloader_config
        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=self.num_processes,
            process_index=self.process_index,
            split_batches=config.split_batches,
            put_on_device=device_placement if device_placement is not None else self.device_placement,
            rng_types=list(self.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
            torch_device_mesh=self.torch_device_mesh,
        )
        prepared._is_accelerate_prepared = True
        return _remember(self._dataloaders, prepared)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that yields ``dataloader``'s batches from the ``num_batches + 1``-th on.

        Catalog: data.skip_first_batches.
        """
        return skip_first_batches(dataloader, num_batches=num_batches)

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's model without what `prepare` wrapped around it.

        Catalog: prepare.unwrap, unwrap.keep_fp32_wrapper. See `utils.extract_model_from_parallel`.
        """
        return extract_model_from_parallel(model, keep_fp32_wrapper, keep_torch_compile)

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """True when ``model`` was dispatched over several devices with a device map.

        Catalog: prepare.verify_device_map. See `utils.other.has_device_map`.
        """
        return has_device_map(model)

    # -- backward, accumulation, synchronisation ------------------------------

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Use instead of ``loss.backward()``: divides the loss by the accumulation steps, scales it under fp16.

        Rule: gradients become those of ``loss / gradient_accumulation_steps``
        (times the scaler's scale under fp16, undone before the update);
        ``kwargs`` go to ``backward`` (``retain_graph=True``, ...). Under
        DeepSpeed the engine's backward, and its step at accumulation
        boundaries (`utils.deepspeed.DeepSpeedEngineWrapper`).
        Catalog: plugin.deepspeed_zero, backward.loss, accumulate.doc_example, autocast.fp16_scaler.
        """
        engine = self._deepspeed_engine
        if engine is not None:  # DeepSpeed divides by the accumulation steps itself
            engine.backward(loss, sync_gradients=self.sync_gradients, **kwargs)
            return
        loss = loss / self.gradient_accumulation_steps
        if self.scaler is None and kwargs.get("learning_rate") is not None and self.has_lomo_optimizer:
            return self.lomo_backward(loss, kwargs["learning_rate"])  # LOMO updates inside its fused backward
        self._precision.scale_loss(loss).backward(**kwargs)

    @property
    def _deepspeed_engine(self) -> Any:
        """The DeepSpeed engine's wrapper once `prepare` made one (HF's ``deepspeed_engine_wrapped``), else None."""
        return self.__dict__.get("deepspeed_engine_wrapped")

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Wrap one training step; gradients synchronise every ``gradient_accumulation_steps`` steps.

        Rules: each call counts one step; `sync_gradients` is True on every
        ``gradient_accumulation_steps``-th step and, with
        ``sync_with_dataloader`` (the default), on the last batch of a
        prepared loader (the count restarts there). On the other steps the
        models' gradient synchronisation is off (`no_sync`) unless the plugin
        says ``sync_each_batch``, and the prepared optimizer and scheduler do
        not step. Catalog: accumulate.doc_example, accumulate.plugin,
        accumulate.end_of_dataloader, accumulate.scheduler.
        """
        self._count_step()
        sync_each_batch = self.gradient_state.plugin_kwargs.get("sync_each_batch", False)
        must_sync = self.sync_gradients or (self.use_distributed and sync_each_batch)
        with contextlib.ExitStack() as stack:
            if not must_sync:
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    def _count_step(self) -> None:
        """Advance `step` and decide whether this step synchronises gradients (see `accumulate`)."""
        state = self.gradient_state
        if state.sync_with_dataloader and state.end_of_dataloader:
            self.step = 0
            state._set_sync_gradients(True)
        else:
            self.step += 1
            state._set_sync_gradients(self.step % state.num_steps == 0)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Inside, backward passes of ``model`` keep gradients local; the next backward outside syncs.

        Rule: ``DistributedDataParallel.no_sync`` of a prepared model when
        several processes train; a no-op for a model that is not wrapped.
        Catalog: no_sync.doc_example (erratum: the example calls
        ``no_sync()`` without its model and reuses the first loss).
        """
        if self._deepspeed_engine is not None:  # the engine keeps its own accumulation boundary
            return contextlib.nullcontext()
        return model.no_sync() if self.use_distributed and hasattr(model, "no_sync") else contextlib.nullcontext()

    @staticmethod
    def trigger_sync_in_backward(model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The backward pass inside synchronises gradients, even of forwards run under `no_sync`.

        A no-op outside distributed training. Catalog: no_sync.trigger_sync_in_backward.
        """
        return gradient_sync.sync_in_next_backward(model)

    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager:
        """Train or evaluate to the end when ranks have different numbers of batches.

        Rules: torch's ``Join`` over ``joinables`` (DDP models), enabled when
        batches are uneven; ranks that run out shadow the others'
        collectives instead of leaving them hanging. ``even_batches``
        overrides the prepared map-style loaders' setting inside the block
        and is restored after. On every data-parallel backend (CPU ranks
        on gloo and XLA included), not only GPUs; under an engine that does
        not wrap in DDP (FSDP, DeepSpeed, Megatron-LM) a no-op with HF
        1.15's UserWarning, as HF on a non-GPU type, even on one process;
        otherwise a no-op on one process. Catalog: join.uneven_inputs.
        """
        if self.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM):
            warnings.warn("Joining uneven inputs is only supported for multi-GPU training, as a result "
                          "`join_uneven_inputs` will have no effect.")
            return contextlib.nullcontext()
        if not self.use_distributed:
            return contextlib.nullcontext()
        uneven = not (self.even_batches if even_batches is None else even_batches)
        return gradient_sync.join(joinables, enable=uneven, dataloaders=self._dataloaders, even_batches=even_batches)

    # -- gradients -------------------------------------------------------------

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None) -> None:
        """Divide gradients by the fp16 scaler's scale (all prepared optimizers by default); a no-op otherwise.

        Catalog: unscale.noop, clip.grad_norm.
        """
        if optimizer is None:
            optimizers = self._optimizers
        else:
            optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        self._precision.unscale(optimizers)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Use instead of ``torch.nn.utils.clip_grad_norm_``: unscales first, returns the total norm.

        Catalog: clip.grad_norm.
        """
        self.unscale_gradients()
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Use instead of ``torch.nn.utils.clip_grad_value_``: unscales first.

        Catalog: clip.grad_value.
        """
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def autocast(
        self, autocast_handler: AutocastKwargs | None = None, cache_enabled: bool = False
    ) -> contextlib.AbstractContextManager:
        """Run the block in the configured mixed precision; ``autocast_handler`` overrides the Accelerator's.

        v0.27's ``cache_enabled=True`` (its first parameter then, so also
        positional) is still accepted: torch's autocast cache is on for the
        block, with a FutureWarning naming `AutocastKwargs(cache_enabled=True)`.
        Catalog: autocast.bf16, compat.autocast_cache_enabled. See `precision.MixedPrecision.autocast`.
        """
        if isinstance(autocast_handler, bool):  # v0.27: autocast(cache_enabled, autocast_handler)
            autocast_handler, cache_enabled = None, autocast_handler
        if cache_enabled:
            warnings.warn(
                "Passing `cache_enabled=True` to `accelerator.autocast` is deprecated (v0.27): pass "
                "`autocast_handler=AutocastKwargs(cache_enabled=True)` instead",
                FutureWarning,
                stacklevel=2,
            )
            handler = autocast_handler or self.autocast_handler or AutocastKwargs()
            autocast_handler = dataclasses.replace(handler, cache_enabled=True)
        return self._precision.autocast(autocast_handler)

    # -- memory, profiling ------------------------------------------------------

    def free_memory(self, *objects: Any) -> list[None]:
        """Forget every prepared object, reset `step` to 0, collect garbage.

        Rule: the Accelerator holds no reference to what it prepared anymore,
        so once the script drops its own (``model, optimizer =
        accelerator.free_memory(model, optimizer)`` rebinds them to None),
        the objects are freed. A DeepSpeed engine is destroyed (HF 1.15).
        Catalog: free_memory.resets.
        """
        if hasattr(self, "deepspeed_engine_wrapped"):
            if self.deepspeed_engine_wrapped is not None:
                self.deepspeed_engine_wrapped.engine.destroy()
            self.deepspeed_engine_wrapped = None
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        self.step = 0
        return release_memory(*objects)

    def clear(self, *objects: Any) -> list[None]:
        """Alias of `free_memory`. Catalog: free_memory.resets."""
        return self.free_memory(*objects)

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[torch.profiler.profile]:
        """Profile the block with torch's profiler, yielded to the block.

        Rule: the profiler is built from ``profile_handler``, else the
        Accelerator's `ProfileKwargs`, else the defaults; with
        ``output_trace_dir`` each process writes a Chrome trace
        ``profile_<process_index>.json`` there, and all wait for each other.
        Catalog: profile.context (erratum: the example passes
        ``kwarg_handler=[...]``; the argument is ``kwargs_handlers``).
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(
            os.path.join(handler.output_trace_dir, PROFILE_PATTERN_NAME.format(suffix=self.process_index))
        )
        self.wait_for_everyone()


def _remember(prepared: list[Any], obj: Any) -> Any:
    """Add ``obj`` to one of the Accelerator's lists of prepared objects (once) and return it."""
    if not any(obj is known for known in prepared):
        prepared.append(obj)
    return obj


def _index_handlers(handlers: list[KwargsHandler]) -> dict[type, KwargsHandler]:
    """Map each handler's class to the handler, with HF 1.15's refusals and words.

    Rules: an object that is not a `KwargsHandler` is an AssertionError; the
    same class twice a ValueError; a handler class the Accelerator does not
    take (a plugin, a subclass) a KeyError naming the class.
    """
    indexed: dict[type, KwargsHandler] = {}
    for handler in handlers:
        if not isinstance(handler, KwargsHandler):
            raise AssertionError(
                f"Unsupported kwargs handler passed: {handler}, must be one that inherits "
                "`accelerate_ref.utils.KwargsHandler`."
            )
        if type(handler) in indexed:
            raise ValueError(f"You can only pass one {type(handler)} in `kwargs_handlers`.")
        if type(handler) not in HANDLER_ATTRIBUTES:
            raise KeyError(type(handler))
        indexed[type(handler)] = handler
    return indexed
