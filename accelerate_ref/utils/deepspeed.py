"""DeepSpeed through the real ``deepspeed`` package: `Accelerator.prepare` hands the model and optimizer
to ``deepspeed.initialize`` and returns its engine, as HF accelerate does.

Rules (HF accelerate 1.15's):

* One `prepare` call holds the model and its optimizer (and the data
  loaders whose batch size fills the config); a model without an optimizer,
  or several models, are refused naming DeepSpeed.
* The plugin's config gets its "auto" values from that call:
  ``train_micro_batch_size_per_gpu`` from the smallest batch size of the
  call's data loaders (divided by the processes with ``split_batches``), ``gradient_accumulation_steps`` from the Accelerator,
  ``train_batch_size`` = micro batch x accumulation steps x processes; a
  value the config sets that contradicts them is refused by key
  (`DeepSpeedPlugin.deepspeed_config_process`). The user's torch optimizer
  is DeepSpeed's client optimizer (``zero_allow_untested_optimizer``).
* The model comes back as deepspeed's ``DeepSpeedEngine``; the optimizer
  as a `DeepSpeedOptimizerWrapper` whose ``step``/``zero_grad`` do nothing;
  `Accelerator.backward` goes through `DeepSpeedEngineWrapper.backward`,
  which marks the accumulation boundary from ``sync_gradients``, runs
  ``engine.backward`` (DeepSpeed divides the loss by the accumulation steps
  itself) and, at the boundary, ``engine.step()`` (update and zero grad).

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

import sys
from typing import Any

import torch

from ..checkpoint_store import CheckpointError
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

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine steps its scheduler at each accumulation boundary."""


def is_deepspeed_engine(model: Any) -> bool:
    """Whether ``model`` is a ``DeepSpeedEngine`` (without importing deepspeed when nothing did)."""
    engine_module = sys.modules.get("deepspeed.runtime.engine")
    return engine_module is not None and isinstance(model, engine_module.DeepSpeedEngine)


def fill_config(plugin: Any, batch_size: Any, gradient_accumulation_steps: int, num_processes: int) -> dict:
    """The plugin's config with its "auto" values filled from the prepared objects (see the module docstring)."""
    config = plugin.deepspeed_config
    values: dict[str, Any] = {"gradient_accumulation_steps": gradient_accumulation_steps}
    if batch_size is not None:
        values["train_micro_batch_size_per_gpu"] = batch_size
        values["train_batch_size"] = batch_size * gradient_accumulation_steps * num_processes
    elif "auto" in (config.get("train_micro_batch_size_per_gpu"), config.get("train_batch_size")):
        raise ValueError(
            "DeepSpeed: train_micro_batch_size_per_gpu is 'auto' and no data loader was prepared with the model; "
            "pass the data loader in the same prepare() call or set the value in the DeepSpeed config"
        )
    plugin.deepspeed_config_process(must_match=True, **values)
    return {**config, "zero_allow_untested_optimizer": True}


def prepare_deepspeed(accelerator: Any, args: list[Any]) -> list[Any]:
    """``args`` of one `prepare` call with the model and optimizer replaced by DeepSpeed's engine and wrapper.

    Data loaders are prepared as without DeepSpeed. Catalog: plugin.deepspeed_zero.
    """
    import deepspeed

    prepared = [accelerator._prepare_one(obj, None) if isinstance(obj, torch.utils.data.DataLoader) else obj for obj in args]
    models = [i for i, obj in enumerate(prepared) if isinstance(obj, torch.nn.Module)]
    optimizers = [i for i, obj in enumerate(prepared) if isinstance(obj, torch.optim.Optimizer)]
    if len(models) != 1 or len(optimizers) != 1:
        raise ValueError(
            f"DeepSpeed: prepare() needs one model and its optimizer in the same call (got {len(models)} model(s) "
            f"and {len(optimizers)} optimizer(s))"
        )
    sizes = [obj.batch_size for obj in args if isinstance(obj, torch.utils.data.DataLoader) and obj.batch_size is not None]
    if accelerator.split_batches:
        sizes = [size // accelerator.num_processes for size in sizes]
    batch_size = min(sizes) if sizes else None
    config = fill_config(accelerator._engines.deepspeed_plugin, batch_size, accelerator.gradient_accumulation_steps, accelerator.num_processes)
    model, optimizer = prepared[models[0]], prepared[optimizers[0]]
    engine, engine_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
    accelerator.deepspeed_engine_wrapped = DeepSpeedEngineWrapper(engine)
    wrapped_optimizer = DeepSpeedOptimizerWrapper(engine_optimizer)
    accelerator._models.append(engine)
    accelerator._optimizers.append(wrapped_optimizer)
    prepared[models[0]], prepared[optimizers[0]] = engine, wrapped_optimizer
    return prepared


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
