"""DeepSpeed through the real ``deepspeed`` package: `Accelerator.prepare` hands the model and optimizer
to ``deepspeed.initialize`` and returns its engine, as HF accelerate does.

Rules (HF accelerate 1.15's):

* One `prepare` call holds one model, with its optimizer and scheduler
  (and the data loaders whose batch size fills the config), or alone (an
  engine for inference); several models or optimizers are refused naming
  DeepSpeed. The config is the active plugin's: the first of
  ``Accelerator(deepspeed_plugins={name: plugin})`` until
  `AcceleratorState.select_deepspeed_plugin` picks another.
* An optimizer and scheduler from the config's ``optimizer`` /
  ``scheduler`` sections are stood for by `DummyOptim` / `DummyScheduler`,
  whose lr, weight decay and warmup fill those sections' "auto" values; an
  optimizer or scheduler given both in the config and in code is refused.
* The plugin's config gets its "auto" values from that call:
  ``train_micro_batch_size_per_gpu`` from the smallest batch size of the
  call's data loaders (the largest with ``is_train_batch_min=False``;
  divided by the processes with ``split_batches``) unless the config sets it, ``gradient_accumulation_steps`` from the Accelerator,
  ``train_batch_size`` = micro batch x accumulation steps x processes, the
  ZeRO bucket sizes from ``model.config``'s hidden size (`hidden_size_values`); a
  value the config sets that contradicts them is refused by key
  (`DeepSpeedPlugin.deepspeed_config_process`). The user's torch optimizer
  is DeepSpeed's client optimizer (``zero_allow_untested_optimizer``). The
  classes the plugin's ``transformer_moe_cls_names`` names become the
  model's ZeRO-3 leaf modules (`DeepSpeedPlugin.set_moe_leaf_modules`).
* The model comes back as deepspeed's ``DeepSpeedEngine``; the optimizer
  as a `DeepSpeedOptimizerWrapper` whose ``step``/``zero_grad`` do nothing;
  a scheduler the engine drives as a `DeepSpeedSchedulerWrapper` whose
  ``step`` does nothing;
  `Accelerator.backward` goes through `DeepSpeedEngineWrapper.backward`,
  which marks the accumulation boundary from ``sync_gradients``, runs
  ``engine.backward`` (DeepSpeed divides the loss by the accumulation steps
  itself) and, at the boundary, ``engine.step()`` (update, scheduler step
  and zero grad).
* `Accelerator.save_state` / `load_state` checkpoint each engine through
  DeepSpeed's own ``engine.save_checkpoint`` / ``engine.load_checkpoint``
  (model, ZeRO optimizer partitions and the engine's scheduler) in the
  folder ``pytorch_model`` (``pytorch_model_<i>`` for the i-th engine) of
  the checkpoint; the engine's optimizer and scheduler wrappers are not
  saved again as ``optimizer.bin`` / ``scheduler.bin``.

On CPU DeepSpeed runs with ``DS_ACCELERATOR=cpu`` over the Accelerator's
gloo process group; its first use JIT-compiles its shared-memory
communication op (cached in ``~/.cache/torch_extensions``).

Catalog: plugin.deepspeed_zero, plugin.deepspeed_config.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import sys
from typing import Any, Callable, Optional

import torch

from .._checkpointing.store import CheckpointError
from ..optimizer import AcceleratedOptimizer
from ..scheduler import AcceleratedScheduler
from .constants import MODEL_NAME


class DeepSpeedEngineWrapper:
    """`Accelerator.backward` under DeepSpeed: backward through the engine, step at accumulation boundaries."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: torch.Tensor, sync_gradients: bool = True, **kwargs: Any) -> None:
        """``engine.backward(loss)``; at an accumulation boundary (``sync_gradients``) also ``engine.step()``.

        Catalog: plugin.deepspeed_zero.
        """
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> Any:
        """The engine's global gradient norm of the last step, as a number."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The prepared optimizer under DeepSpeed: the engine steps and zeroes it in `Accelerator.backward`."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: Any = None) -> None:
        """Nothing: ``engine.step()`` zeroes the gradients."""

    def step(self) -> None:
        """Nothing: ``engine.step()`` updates the weights at the accumulation boundary."""

    @property
    def step_was_skipped(self) -> bool:
        """Whether DeepSpeed's loss scaler skipped the last step (an overflow)."""
        return bool(getattr(self.optimizer, "overflow", False))


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The prepared scheduler when DeepSpeed's engine drives it: ``engine.step()`` steps it in `Accelerator.backward`.

    Catalog: plugin.deepspeed_zero.
    """

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    def step(self) -> None:
        """Nothing: the engine steps its scheduler at each accumulation boundary."""


class DummyOptim:
    """Stands for the optimizer of the DeepSpeed config's ``optimizer`` section in `Accelerator.prepare`.

    ``params`` are what it steps (parameters or groups); ``lr`` and
    ``weight_decay`` fill the section's "auto" values. Catalog: plugin.deepspeed_config.
    """

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler of the DeepSpeed config's ``scheduler`` section (or ``lr_scheduler_callable(optimizer)``).

    ``warmup_num_steps`` and ``total_num_steps`` fill the section's "auto"
    values; the warmup rises to ``optimizer``'s lr. Catalog: plugin.deepspeed_config.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: Optional[int] = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Optional[Callable[[Any], Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class HfDeepSpeedConfig:
    """A DeepSpeed config (dict, JSON file path, JSON text or its url-safe base64) queried by dotted keys.

    Rules: a dict is deep-copied, never changed in place; anything that does
    not parse is a ValueError. ``is_offload()`` is true when ZeRO 2 or 3
    offloads the optimizer or the parameters to cpu or nvme.
    Catalog: plugin.deepspeed_config.
    """

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config = _parse_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage and whether anything is offloaded from the config (again, after a change)."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {self.get_value("zero_optimization.offload_optimizer.device"), self.get_value("zero_optimization.offload_param.device")}
        self._offload = (self.is_zero2() or self.is_zero3()) and bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[Optional[dict], str]:
        """The dict holding the last part of ``ds_key_long`` (None where a parent is missing), and that part."""
        *parents, leaf = ds_key_long.split(".")
        node: Any = self.config
        for part in parents:
            node = node.get(part)
            if node is None:
                return None, leaf
        return node, leaf

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at ``ds_key_long`` ("zero_optimization.stage"), or ``default`` where it is not set."""
        node, leaf = self.find_config_node(ds_key_long)
        return default if node is None else node.get(leaf, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the entry at ``ds_key_long``; a missing one is a ValueError only with ``must_exist``."""
        node, leaf = self.find_config_node(ds_key_long)
        if node is None or leaf not in node:
            if must_exist:
                raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
            return
        node.pop(leaf)

    def is_true(self, ds_key_long: str) -> bool:
        """Whether the value is set and true (unset is False)."""
        value = self.get_value(ds_key_long)
        return value is not None and bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """Whether the value is set and false (unset is False)."""
        value = self.get_value(ds_key_long)
        return value is not None and not bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload


def _parse_config(config: Any) -> dict:
    """`HfDeepSpeedConfig`'s config: a dict's deep copy, a JSON file, JSON text, or url-safe base64 of JSON text."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        with open(config, encoding="utf-8") as handle:
            return json.load(handle)
    try:
        try:
            return json.loads(config)
        except json.JSONDecodeError:
            return json.loads(base64.urlsafe_b64decode(config).decode("utf-8"))
    except (UnicodeDecodeError, AttributeError, ValueError, TypeError):
        raise ValueError(
            f"Expected a string path to an existing deepspeed config, or a dictionary, or a base64 encoded string. Received: {config}"
        ) from None


def get_active_deepspeed_plugin(state: Any) -> Any:
    """The `DeepSpeedPlugin` the Accelerator of ``state`` drives; a ValueError where DeepSpeed is not enabled.

    Catalog: plugin.deepspeed_config.
    """
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError(
            "Couldn't retrieve the active `DeepSpeedPlugin` as none were enabled. Please make sure that `Accelerator` "
            "is configured for `deepspeed` (Accelerator(deepspeed_plugin=...)) before calling this function."
        )
    return plugin


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> Any:
    """DeepSpeed's CPU version of ``optimizer`` over its parameter groups, for ZeRO's optimizer offload.

    Rules (HF's): Adagrad becomes ``DeepSpeedCPUAdagrad``, anything else
    ``DeepSpeedCPUAdam`` (in AdamW mode for ``torch.optim.AdamW``), with the
    optimizer's ``lr`` and ``weight_decay``. Catalog: plugin.deepspeed_zero.
    """
    defaults = {key: value for key, value in optimizer.defaults.items() if key in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adagrad):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=isinstance(optimizer, torch.optim.AdamW), **defaults)


def is_deepspeed_engine(model: Any) -> bool:
    """Whether ``model`` is a ``DeepSpeedEngine`` (without importing deepspeed when nothing did)."""
    engine_module = sys.modules.get("deepspeed.runtime.engine")
    return engine_module is not None and isinstance(model, engine_module.DeepSpeedEngine)


#: What `prepare` puts where the config says "auto" and nothing prepared decides (HF's values).
PREPARE_DEFAULTS = {"gradient_clipping": 1.0, "zero_optimization.stage3_gather_16bit_weights_on_model_save": False}


#: HF's words when the micro batch size is "auto" and no data loader of the call gives it.
NO_BATCH_SIZE = (
    "When using DeepSpeed, `accelerate.prepare()` requires you to pass at least one of training or evaluation dataloaders "
    "with `batch_size` attribute returning an integer value "
    "or alternatively set an integer value in `train_micro_batch_size_per_gpu` in the deepspeed config file "
    "or assign integer value to `AcceleratorState().deepspeed_plugin.deepspeed_config['train_micro_batch_size_per_gpu']`."
)
#: ... and when one of its data loaders has no batch size.
NONE_BATCH_SIZE = (
    "At least one of the dataloaders passed to `accelerate.prepare()` has `None` as batch size. "
    "Please set an integer value in `train_micro_batch_size_per_gpu` in the deepspeed config file "
    "or assign integer value to `AcceleratorState().deepspeed_plugin.deepspeed_config['train_micro_batch_size_per_gpu']`."
)


def micro_batch_size(plugin: Any, loaders: list[Any], split_batches: bool, num_processes: int) -> int | None:
    """Each device's batch size: the config's ``train_micro_batch_size_per_gpu`` unless it is "auto" (None when the
    config has none), else the smallest batch of the call's data loaders (the largest with
    ``is_train_batch_min=False``), a
    ``split_batches`` batch divided among the processes. "auto" with no data loader, or with one whose batch size
    is None, is a ValueError in HF's words. Catalog: plugin.deepspeed_config.
    """
    if plugin.deepspeed_config.get("train_micro_batch_size_per_gpu") != "auto":
        return plugin.deepspeed_config.get("train_micro_batch_size_per_gpu")
    if not loaders:
        raise ValueError(NO_BATCH_SIZE)
    if any(loader.batch_size is None for loader in loaders):
        raise ValueError(NONE_BATCH_SIZE)
    sizes = [loader.batch_size // num_processes if split_batches else loader.batch_size for loader in loaders]
    return min(sizes) if plugin.is_train_batch_min else max(sizes)


def fill_config(plugin: Any, batch_size: Any, gradient_accumulation_steps: int, num_processes: int, **values: Any) -> dict:
    """The plugin's config with its "auto" values filled from the prepared objects (see the module docstring);
    ``batch_size`` is :func:`micro_batch_size`'s.

    ``values`` (dotted keys) fill the optimizer and scheduler sections for
    `DummyOptim` / `DummyScheduler`; an "auto" clipping is 1.0 and an "auto"
    16-bit save off (`PREPARE_DEFAULTS`). A client torch optimizer needs
    ``zero_allow_untested_optimizer``. Catalog: plugin.deepspeed_config.
    """
    config = plugin.deepspeed_config
    for key, value in PREPARE_DEFAULTS.items():  # HF's defaults fill only "auto" values
        plugin.fill_match(key, must_match=False, **{key: value})
    values["gradient_accumulation_steps"] = gradient_accumulation_steps
    if batch_size is not None:
        values["train_micro_batch_size_per_gpu"] = batch_size
        values["train_batch_size"] = batch_size * gradient_accumulation_steps * num_processes
    plugin.deepspeed_config_process(must_match=True, **values)
    return config if "optimizer" in config else {**config, "zero_allow_untested_optimizer": True}


def _check_config_objects(config: dict, optimizer: Any, scheduler: Any) -> None:
    """Refuse an optimizer or scheduler given both in the config and in code, or a dummy without its config section.

    HF's rules and words. Catalog: plugin.deepspeed_config.
    """
    if isinstance(optimizer, DummyOptim) != ("optimizer" in config):
        raise ValueError(
            "You cannot create a `DummyOptim` without specifying an optimizer in the config file."
            if isinstance(optimizer, DummyOptim)
            else "You cannot specify an optimizer in the config file and in the code at the same time. Please remove "
            "the optimizer from the config file or create `accelerate.utils.DummyOptim` in the code."
        )
    if scheduler is None:
        return
    if "scheduler" in config and not isinstance(scheduler, DummyScheduler):
        raise ValueError(
            "You cannot specify a scheduler in the config file and in the code at the same time. Please remove the "
            "scheduler from the config file or create `accelerate.utils.DummyScheduler` in the code."
        )
    if isinstance(scheduler, DummyScheduler) and "scheduler" not in config and scheduler.lr_scheduler_callable is None:
        raise ValueError(
            "Either specify a scheduler in the config file or pass in the `lr_scheduler_callable` parameter when "
            "using `accelerate.utils.DummyScheduler`."
        )
    if isinstance(optimizer, DummyOptim) and not isinstance(scheduler, DummyScheduler):
        raise ValueError("You can only specify `accelerate.utils.DummyScheduler` in the code when using `accelerate.utils.DummyOptim`.")


def _dummy_values(optimizer: Any, scheduler: Any, num_processes: int, split_batches: bool) -> dict[str, Any]:
    """Config values the dummies fill: the optimizer's lr and weight decay, the warmup scheduler's bounds and steps.

    Rule (HF's): ``warmup_min_lr`` 0, ``warmup_max_lr`` the optimizer's lr,
    ``warmup_num_steps`` at least 1, ``total_num_steps`` divided by the
    processes unless ``split_batches``. Catalog: plugin.deepspeed_config.
    """
    values: dict[str, Any] = {}
    if isinstance(optimizer, DummyOptim):
        values.update({"optimizer.params.lr": optimizer.lr, "optimizer.params.weight_decay": optimizer.weight_decay})
    if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
        owner = scheduler.optimizer
        max_lr = owner.defaults["lr"] if getattr(owner, "defaults", None) is not None else getattr(owner, "lr", None)
        values.update({
            "scheduler.params.warmup_min_lr": 0,
            "scheduler.params.warmup_max_lr": max_lr,
            "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps),
        })
        if scheduler.total_num_steps is not None:
            total = scheduler.total_num_steps
            values["scheduler.params.total_num_steps"] = total if split_batches else math.ceil(total / num_processes)
    return values


#: Config keys whose "auto" HF derives from the model's hidden size h: h*h, 0.9*h*h and 10*h.
HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


def hidden_size_values(model: Any, plugin: Any) -> dict[str, int]:
    """Values for the `HIDDEN_SIZE_KEYS` the plugin's config leaves "auto", from ``model.config``.

    Rules (HF's): the hidden size is ``config.hidden_size``, else the largest
    of ``config.hidden_sizes``; a model without either, where one of those
    keys is "auto", is a ValueError naming the keys. Catalog: plugin.deepspeed_config.
    """
    auto_keys = [key for key in HIDDEN_SIZE_KEYS if plugin.is_auto(key)]
    if not auto_keys:
        return {}
    reason = (
        "therefore it's not possible to automatically fill out the following `auto` entries in the DeepSpeed config "
        f"file: {auto_keys}. You can fix that by replacing `auto` values for these keys with an integer value of your choice."
    )
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("Can't find `model.config` entry, " + reason)
    if hasattr(config, "hidden_size"):
        hidden = config.hidden_size
    elif hasattr(config, "hidden_sizes"):
        hidden = max(config.hidden_sizes)
    else:
        raise ValueError("Can find neither `model.config.hidden_size` nor `model.config.hidden_sizes`, " + reason)
    values = dict(zip(HIDDEN_SIZE_KEYS, (hidden * hidden, int(0.9 * hidden * hidden), 10 * hidden)))
    return {key: values[key] for key in auto_keys}  # a set value is the user's, never contradicted


def _initialize_arguments(model: Any, optimizer: Any, scheduler: Any, config: dict) -> dict[str, Any]:
    """What ``deepspeed.initialize`` gets besides the config: the model, and the optimizer or the parameters
    the config's optimizer steps, and a scheduler the engine drives (a callable, or one of DeepSpeed's).

    Rule (HF's): with ZeRO's optimizer offload (and ``zero_force_ds_cpu_optimizer``
    not false) a torch optimizer becomes its DeepSpeed CPU version
    (`map_pytorch_optim_to_deepspeed`). Catalog: plugin.deepspeed_zero.
    """
    import deepspeed

    arguments: dict[str, Any] = {"model": model}
    if optimizer is None:  # an engine for inference
        return arguments
    if isinstance(optimizer, DummyOptim):
        arguments["model_parameters"] = optimizer.params
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is not None:
            arguments["lr_scheduler"] = scheduler.lr_scheduler_callable
    else:
        offload = config["zero_optimization"].get("offload_optimizer", {}).get("device", "none")
        if offload != "none" and config.get("zero_force_ds_cpu_optimizer", True):
            optimizer = map_pytorch_optim_to_deepspeed(optimizer)
        arguments["optimizer"] = optimizer
        if type(scheduler).__name__ in deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES:
            arguments["lr_scheduler"] = scheduler
    return arguments


def prepare_deepspeed(accelerator: Any, args: list[Any]) -> list[Any]:
    """``args`` of one `prepare` call with the model, optimizer and scheduler replaced by DeepSpeed's engine and wrappers.

    Rules: the active plugin's config (`Accelerator.deepspeed_plugin`; one of
    several with ``deepspeed_plugins``); one model, alone (an engine for
    inference) or with one optimizer (a torch optimizer, or a `DummyOptim`
    for the config's ``optimizer`` section); at most one scheduler (a torch
    one, one of DeepSpeed's, or a `DummyScheduler` for the config's
    ``scheduler`` section or its ``lr_scheduler_callable``). A scheduler the
    engine drives comes back as a `DeepSpeedSchedulerWrapper` (stepped by
    ``engine.step()``), any other as an `AcceleratedScheduler`. `Accelerator.backward`
    goes through the first engine prepared. Data loaders
    are prepared as without DeepSpeed. Catalog: plugin.deepspeed_zero, plugin.deepspeed_config.
    """
    import deepspeed

    prepared = [accelerator._prepare_one(obj, None) if isinstance(obj, torch.utils.data.DataLoader) else obj for obj in args]
    models = [i for i, obj in enumerate(prepared) if isinstance(obj, torch.nn.Module)]
    optimizers = [i for i, obj in enumerate(prepared) if isinstance(obj, (torch.optim.Optimizer, DummyOptim))]
    scheduler_types = (torch.optim.lr_scheduler.LRScheduler, DummyScheduler)
    schedulers = [
        i for i, obj in enumerate(prepared)
        if isinstance(obj, scheduler_types) or type(obj).__name__ in deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES
    ]
    if len(models) != 1 or len(optimizers) > 1 or len(schedulers) > 1:
        raise ValueError(
            f"DeepSpeed: prepare() needs one model, with at most one optimizer and one scheduler, in the same call "
            f"(got {len(models)} model(s), {len(optimizers)} optimizer(s) and {len(schedulers)} scheduler(s))"
        )
    model = prepared[models[0]]
    optimizer = prepared[optimizers[0]] if optimizers else None
    scheduler = prepared[schedulers[0]] if schedulers else None
    plugin = accelerator.deepspeed_plugin
    if optimizer is not None:
        _check_config_objects(plugin.deepspeed_config, optimizer, scheduler)
    loaders = [obj for obj in args if isinstance(obj, torch.utils.data.DataLoader)]
    batch_size = micro_batch_size(plugin, loaders, accelerator.split_batches, accelerator.num_processes)
    plugin.set_moe_leaf_modules(model)
    dummy_values = _dummy_values(optimizer, scheduler, accelerator.num_processes, accelerator.split_batches)
    dummy_values.update(hidden_size_values(model, plugin))
    config = fill_config(plugin, batch_size, accelerator.gradient_accumulation_steps, accelerator.num_processes, **dummy_values)
    engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(
        **_initialize_arguments(model, optimizer, scheduler, config), config=config, dist_init_required=False
    )
    if accelerator.deepspeed_engine_wrapped is None:  # `backward` goes through the first engine prepared (HF's rule)
        accelerator.deepspeed_engine_wrapped = DeepSpeedEngineWrapper(engine)
    accelerator._models.append(engine)
    prepared[models[0]] = engine
    if optimizer is None:
        return prepared
    wrapped_optimizer = DeepSpeedOptimizerWrapper(engine_optimizer)
    accelerator._optimizers.append(wrapped_optimizer)
    prepared[optimizers[0]] = wrapped_optimizer
    if scheduler is not None:
        if engine_scheduler is not None:
            wrapped_scheduler: AcceleratedScheduler = DeepSpeedSchedulerWrapper(engine_scheduler, wrapped_optimizer)
        else:
            wrapped_scheduler = AcceleratedScheduler(
                scheduler, wrapped_optimizer, step_with_optimizer=accelerator.step_scheduler_with_optimizer,
                split_batches=accelerator.split_batches,
            )
        accelerator._schedulers.append(wrapped_scheduler)
        prepared[schedulers[0]] = wrapped_scheduler
    return prepared


def deepspeed_ulysses_dl_adapter(accelerator: Any, dl: Any, model: Any) -> Any:
    """``dl`` unchanged without sequence parallelism; else DeepSpeed's ``UlyssesSPDataLoaderAdapter``
    over it, on the sequence-parallel group DeepSpeed's engine set up.

    Rules (HF's): the sequence-parallel size is the Accelerator's
    ``parallelism_config.sp_size`` (1 without a parallelism config; the Accelerator
    refuses sp_size > 1 today, so the loader comes back as given); the adapter gathers one batch per
    sequence-parallel rank and hands each rank its slice of every batch's sequence,
    on ``model.device``. For a loader prepared apart from its model, after
    ``prepare(model)``. Catalog: plugin.deepspeed_config.
    """
    parallelism_config = accelerator.parallelism_config
    if (parallelism_config.sp_size if parallelism_config else 1) == 1:
        return dl
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from deepspeed.utils import groups

    return UlyssesSPDataLoaderAdapter(
        dl,
        sp_rank=groups._get_sequence_parallel_rank(),
        sp_group=groups._get_sequence_parallel_group(),
        sp_world_size=groups._get_sequence_parallel_world_size(),
        device=model.device,
    )


def engine_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """The full state dict of the engine's module on every rank (ZeRO-3 partitions gathered), on the CPU.

    Catalog: plugin.deepspeed_zero.
    """
    import deepspeed

    module = engine.module
    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
        return {key: value.detach().cpu().clone() for key, value in module.state_dict().items()}


def checkpoint_tag(index: int) -> str:
    """The checkpoint folder of the ``index``-th engine: ``pytorch_model``, ``pytorch_model_1``, ...

    Catalog: plugin.deepspeed_zero.
    """
    return MODEL_NAME if index == 0 else f"{MODEL_NAME}_{index}"


def save_engine_checkpoint(engine: Any, output_dir: str, index: int, **save_kwargs: Any) -> None:
    """``engine.save_checkpoint`` into ``output_dir/checkpoint_tag(index)``: model, optimizer partitions, scheduler.

    Collective: every rank writes its ZeRO partitions. ``save_kwargs`` are
    DeepSpeed's (``client_state``, ``exclude_frozen_parameters``...).
    Catalog: plugin.deepspeed_zero.
    """
    engine.save_checkpoint(output_dir, checkpoint_tag(index), **save_kwargs)


def load_engine_checkpoint(engine: Any, input_dir: str, index: int, **load_kwargs: Any) -> None:
    """``engine.load_checkpoint`` from ``input_dir/checkpoint_tag(index)``; a missing checkpoint is a CheckpointError.

    ``load_kwargs`` are DeepSpeed's (``load_optimizer_states``,
    ``load_module_strict``...). Catalog: plugin.deepspeed_zero.
    """
    path, _ = engine.load_checkpoint(input_dir, checkpoint_tag(index), **load_kwargs)
    if path is None:  # DeepSpeed only logs a warning when the folder is not there
        raise CheckpointError(f"{input_dir}/{checkpoint_tag(index)} holds no DeepSpeed checkpoint of engine {index}")
