"""The `Accelerator`'s saving and loading methods, as a mixin.

`CheckpointingMixin` is a base of `Accelerator`; it uses the Accelerator's
``state``, ``project_configuration``, ``unwrap_model``, ``step``,
``scaler`` and its lists of prepared objects (``_models``, ``_optimizers``,
``_schedulers``, ``_dataloaders``). What goes into a checkpoint is in
`checkpointing`, how a checkpoint directory appears only when complete in
`_checkpointing.store`, model files and shards in `utils.modeling`.

`save_state` and `load_state` are collective: every process calls them.
Each runs in phases; after each phase the processes exchange whether they
succeeded (with `gather_object`, which also makes every phase end
together), so a failure on one process fails the call on every process
instead of leaving the others waiting, and nothing is published.

Catalog: save.once_per_machine, save.array_example, save_model.default,
save_model.sharded, save_model.reload, get_state_dict.unwrap,
save_state.roundtrip, save_state.resume_data_order, save_state.file_names,
save_state.auto_naming, save_state.total_limit, register_for_checkpointing,
save_state.pre_hooks, plugin.fsdp_state_dict, plugin.deepspeed_zero.
"""

from __future__ import annotations

import collections
import json
import os
import re
import uuid
from typing import Any, Callable, Optional, Union

import torch
from torch.utils.hooks import RemovableHandle

from .._checkpointing import store as store
from ..checkpointing import (
    check_custom_files,
    load_accelerator_state,
    load_custom_state,
    save_accelerator_state,
    save_custom_state,
)
from ..utils.fsdp_utils import (
    is_fsdp_model,
    load_fsdp_model,
    load_fsdp_optimizer,
    optimizer_owner,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from ..utils.deepspeed import (
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    is_deepspeed_engine,
    load_engine_checkpoint,
    save_engine_checkpoint,
)
from ..utils.constants import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from ..logging import get_logger
from ..utils.modeling import get_state_dict_offloaded_model, has_offloaded_params, shard_checkpoint
from ..utils.operations import broadcast_object_list, gather_object
from ..utils.other import get_pretty_name
from ..utils._other.serialization import clean_state_dict_for_safetensors, save, write_atomically

PathLike = Union[str, os.PathLike]
#: These methods are HF's `Accelerator`'s: they log under its module, accelerate.accelerator.
_LOGGER_NAME = "accelerate_ref.accelerator"  # HF 1.15 logs these under its accelerator module


class CheckpointingMixin:
    """`save`, `save_model`, `get_state_dict`, `save_state`, `load_state` and their registries."""

    # -- registries (created on first use; `Accelerator.__init__` does not know this mixin) --

    @property
    def _custom_objects(self) -> list[Any]:
        """Objects `register_for_checkpointing` registered, in order."""
        return self.__dict__.setdefault("_custom_objects", [])

    @property
    def _save_model_state_pre_hook(self) -> collections.OrderedDict[int, Callable[..., None]]:
        return self.__dict__.setdefault("_save_model_state_pre_hook", collections.OrderedDict())

    @property
    def _load_model_state_pre_hook(self) -> collections.OrderedDict[int, Callable[..., None]]:
        return self.__dict__.setdefault("_load_model_state_pre_hook", collections.OrderedDict())

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets. Catalog: save_state.auto_naming."""
        return self.project_configuration.iteration

    @property
    def _writes_shared_files(self) -> bool:
        """Whether this process writes what is saved once (per machine with ``save_on_each_node``)."""
        return self.is_local_main_process if self.project_configuration.save_on_each_node else self.is_main_process

    # -- saving objects and models -------------------------------------------------------

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """Save ``obj`` to ``f`` once, in place of ``torch.save``; once per machine with ``save_on_each_node``.

        Rule: see `utils._other.serialization.save`; ``save_on_each_node`` comes from
        the `ProjectConfiguration`. ``save([0, 1, 2, 3], "array.pkl")``
        round-trips through ``torch.load``.
        Catalog: save.once_per_machine, save.array_example.
        """
        save(obj, f, save_on_each_node=self.project_configuration.save_on_each_node, safe_serialization=safe_serialization)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The state dict of a prepared model: of the user's model (no ``module.`` prefixes), or of the wrapper.

        Rule: with ``unwrap=True`` (default) the state dict of
        `unwrap_model(model)`, in the precision the model trains in; with
        ``unwrap=False`` that of ``model`` as prepared (a
        ``DistributedDataParallel``'s keys start with ``module.``).
        An FSDP-sharded model gives its full, unsharded state on every rank,
        a DeepSpeed engine its module's (ZeRO-3 partitions gathered).
        Catalog: get_state_dict.unwrap, save_model.default, plugin.fsdp, plugin.deepspeed_zero.
        """
        from ..utils.deepspeed import engine_state_dict, is_deepspeed_engine
        from ..utils.fsdp_utils import full_state_dict, is_fsdp_model

        if unwrap and is_deepspeed_engine(model):
            return engine_state_dict(model)
        if unwrap and is_fsdp_model(self.unwrap_model(model)):
            return full_state_dict(self.unwrap_model(model))
        return (self.unwrap_model(model) if unwrap else model).state_dict()

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: PathLike,
        max_shard_size: Union[int, str] = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Save the unwrapped model's weights to ``save_directory``, sharded above ``max_shard_size``.

        Rules: the weights are `get_state_dict(model)` in the training
        precision; ``model.safetensors`` (``pytorch_model.bin`` with
        ``safe_serialization=False``), or shards
        ``model-00001-of-0000N.safetensors`` ... with
        ``model.safetensors.index.json`` (``pytorch_model.bin.index.json``)
        when they exceed ``max_shard_size`` (`shard_checkpoint`); the main
        process writes (each machine's with ``save_on_each_node``), each
        file atomically, the index last, and only then removes weights
        files of an earlier save of the same kind that the new one does not
        use. Loadable with `load_checkpoint_in_model` or ``load_state_dict``
        on the bare class. With safetensors, tied weights are stored once
        (`clean_state_dict_for_safetensors`, which logs the names it drops).
        As in HF 1.15, a ``save_directory`` that is a file is logged at ERROR
        (main process) and nothing is saved, and a model with parameters on
        the meta device is a RuntimeError, both before anything is written;
        a model with offloaded parameters is saved from its offload.
        Catalog: save_model.default, save_model.sharded, save_model.reload.
        """
        directory = os.fspath(save_directory)
        if os.path.isfile(directory):
            get_logger(_LOGGER_NAME).error(f"Provided path ({directory}) should be a directory, not a file")
            return
        if any(has_offloaded_params(module) for module in model.modules()):
            state_dict = get_state_dict_offloaded_model(model)
        else:
            if any(parameter.device.type == "meta" for parameter in model.parameters()):
                raise RuntimeError("You can't save the model since some parameters are on the meta device.")
            state_dict = self.get_state_dict(model)
        if safe_serialization:
            state_dict = clean_state_dict_for_safetensors(state_dict)
        weights_name, index_name = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME) if safe_serialization else (WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
        shards, index = shard_checkpoint(state_dict, max_shard_size, weights_name)
        if not self._writes_shared_files:
            return
        os.makedirs(directory, exist_ok=True)
        for name, shard in shards.items():
            self.save(shard, os.path.join(directory, name), safe_serialization=safe_serialization)
        if index is not None:
            payload = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
            write_atomically(os.path.join(directory, index_name), lambda stream: stream.write(payload))
        _remove_stale_weights(directory, weights_name, index_name, keep=set(shards) | ({index_name} if index else set()))

    # -- registries ----------------------------------------------------------------------------

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore ``objects`` with `save_state` / `load_state` (as ``custom_checkpoint_<i>.pkl``).

        Rule: every object needs ``state_dict`` and ``load_state_dict``
        attributes; if one lacks them a ValueError lists each such object
        (``Item at index <i>``, numbered among the invalid ones, with its
        `get_pretty_name`, as HF 1.15 words it) and none is registered.
        Objects are numbered in the order they were registered, and a
        checkpoint must be loaded with the same objects registered.
        Catalog: register_for_checkpointing.
        """
        invalid = [obj for obj in objects if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"))]
        if invalid:
            raise ValueError(
                "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                "The following inputs are invalid:"
                + "".join(f"\n\t- Item at index {index}, `{get_pretty_name(obj)}`" for index, obj in enumerate(invalid))
            )
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in `save_state` before anything is written.

        Rules: ``models`` is the list of prepared models, ``weights`` the
        list of their state dicts that will be saved (a hook that saves a
        model its own way removes its entry), ``output_dir`` the directory
        being written (files the hook puts there are part of the checkpoint,
        published with it). Hooks run in the order registered, on every
        process; ``handle.remove()`` unregisters.
        Catalog: save_state.pre_hooks.
        """
        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in `load_state` before anything is loaded.

        Rules: ``models`` is the list of prepared models that will be
        loaded (a hook that loads a model its own way removes it),
        ``input_dir`` the checkpoint directory. ``handle.remove()``
        unregisters. Catalog: save_state.pre_hooks.
        """
        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle

    # -- collective steps -----------------------------------------------------------------

    def _agree(self, action: str, step: Callable[[], Any]) -> Any:
        """Run ``step`` on every process; all return its result, or all raise if it failed anywhere.

        The process that failed raises its own exception; the others a
        CheckpointError naming the failed processes and their errors.
        """
        result, error = None, None
        try:
            result = step()
        except Exception as caught:  # reported to every process, then raised
            error = caught
        reports = gather_object([(self.process_index, None if error is None else f"{type(error).__name__}: {error}")])
        if error is not None:
            raise error
        failed = [f"process {index}: {message}" for index, message in reports if message is not None]
        if failed:
            raise store.CheckpointError(f"{action} failed on other processes, nothing was published or loaded:\n" + "\n".join(failed))
        return result

    def _from_main(self, value: Any) -> Any:
        """The main process's ``value``, on every process."""
        return broadcast_object_list([value], from_process=0)[0]

    # -- save_state / load_state ---------------------------------------------------------------

    def _checkpoint_target(self, output_dir: Optional[PathLike]) -> str:
        """Where `save_state` publishes, checked before anything is written."""
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            if config.project_dir is None:
                raise ValueError("automatic_checkpoint_naming needs a project_dir in the ProjectConfiguration")
            target = os.path.join(config.project_dir, store.CHECKPOINTS_FOLDER, f"checkpoint_{self.save_iteration}")
            if os.path.exists(target):
                raise ValueError(  # HF's words
                    f"Checkpoint directory {target} ({self.save_iteration}) already exists. Please manually override "
                    "`self.save_iteration` with what iteration to start with."
                )
            return target
        if output_dir is None:
            raise ValueError("save_state needs an output_dir unless ProjectConfiguration(automatic_checkpoint_naming=True)")
        target = os.path.abspath(os.path.expanduser(os.fspath(output_dir)))
        store.check_replaceable(target)
        return target

    def save_state(self, output_dir: Optional[PathLike] = None, safe_serialization: bool = True, **save_model_func_kwargs: Any) -> str:
        """Save models, optimizers, schedulers, scaler, RNG states, loader positions and registered objects.

        Rules: into ``output_dir``, or with automatic checkpoint naming into
        ``project_dir/checkpoints/checkpoint_<iteration>`` (an existing one
        is an error); ``project_configuration.iteration`` then advances.
        Files: see `checkpointing`; a model sharded by an `fsdp_plugin` and
        its optimizers are written by `save_fsdp_model` / `save_fsdp_optimizer`
        (``pytorch_model_fsdp.bin`` and ``optimizer.bin`` for FULL_STATE_DICT,
        the torch.distributed.checkpoint folders ``pytorch_model_fsdp_<i>/``
        and ``optimizer_<i>/`` for SHARDED_STATE_DICT) and read back into
        each rank's shards by `load_state`; a DeepSpeed engine, with its
        optimizer and scheduler, by its own ``save_checkpoint`` into
        ``pytorch_model/`` (``pytorch_model_<i>/``; `utils.deepspeed`). The checkpoint becomes visible only when
        complete: it is written under a temporary name next to its final
        one, every process writes its part (its own RNG file included), and
        once all have succeeded the main process (each machine's, where the
        file system is not shared) writes the manifest, fsyncs and renames
        it into place, replacing a checkpoint saved there before. A failure
        anywhere fails the call on every process and leaves the published
        checkpoints as they were. Then, with ``total_limit``, the oldest
        published checkpoints are deleted until ``total_limit`` remain.
        Save hooks run first (`register_save_state_pre_hook`). Returns the
        checkpoint's directory. ``save_model_func_kwargs`` go to DeepSpeed's
        ``save_checkpoint``; without a DeepSpeed engine none are accepted.
        Catalog: save_state.roundtrip, save_state.file_names, save_state.auto_naming,
        save_state.total_limit, save_state.pre_hooks, save_state.resume_data_order,
        register_for_checkpointing, plugin.deepspeed_zero.
        """
        if save_model_func_kwargs and not self._deepspeed_engines():
            raise TypeError(f"save_state got unexpected keyword arguments {sorted(save_model_func_kwargs)}")
        config = self.project_configuration
        target = self._agree("save_state", lambda: self._checkpoint_target(output_dir))
        token = self._from_main(uuid.uuid4().hex[:16])
        staging = store.hidden_path(target, "partial", token)
        owner = self._open_staging(target, token)
        try:
            self._agree("save_state", lambda: self._write_state(staging, safe_serialization, save_model_func_kwargs))
            self._agree("save_state", lambda: owner and self._publish(staging, target, token))
        except BaseException:
            if owner:
                store.discard(staging)
            raise
        config.iteration += 1
        return target

    def _open_staging(self, target: str, token: str) -> bool:
        """Create the staging directory: the main process first, then each process that does not see it
        (on a machine whose file system is not shared). True on the process that created it (and publishes it)."""
        created = self._agree("save_state", lambda: self.is_main_process and store.open_staging(target, token))
        return self._agree("save_state", lambda: created or (not self.is_main_process and store.open_staging(target, token)))

    def _write_state(self, staging: str, safe_serialization: bool, engine_kwargs: dict[str, Any]) -> None:
        """This process's part of a checkpoint, written into ``staging``."""
        sharded, owners = self._fsdp_parts()
        engines = self._deepspeed_engines()
        weights = [self.get_state_dict(model) for i, model in enumerate(self._models) if i not in sharded and i not in engines]
        for hook in list(self._save_model_state_pre_hook.values()):
            hook(self._models, weights, staging)
        plugin = self._engines.fsdp_plugin
        for index, model in sharded.items():
            save_fsdp_model(plugin, self, model, staging, index)
        for index, model in owners.items():
            save_fsdp_optimizer(plugin, self, self._optimizers[index], model, staging, index)
        for index, engine in engines.items():
            save_engine_checkpoint(engine, staging, index, **engine_kwargs)
        on_each_node = self.project_configuration.save_on_each_node
        save_accelerator_state(
            staging,
            weights,
            self._optimizers_saved_here(owners),
            self._schedulers_saved_here(),
            self._dataloaders,
            self.process_index,
            self.step,
            self.scaler,
            save_on_each_node=on_each_node,
            safe_serialization=safe_serialization,
        )
        for index, obj in enumerate(self._custom_objects):
            save_custom_state(obj, staging, index, save_on_each_node=on_each_node)

    def _deepspeed_engines(self) -> dict[int, Any]:
        """The prepared models that are DeepSpeed engines, by index: each checkpoints itself. Catalog: plugin.deepspeed_zero."""
        return {i: model for i, model in enumerate(self._models) if is_deepspeed_engine(model)}

    def _optimizers_saved_here(self, owners: dict[int, torch.nn.Module]) -> list[Any]:
        """Optimizers `checkpointing` saves: not those FSDP (``owners``) or a DeepSpeed engine checkpoint."""
        return [o for i, o in enumerate(self._optimizers) if i not in owners and not isinstance(o, DeepSpeedOptimizerWrapper)]

    def _schedulers_saved_here(self) -> list[Any]:
        """Schedulers `checkpointing` saves: not those a DeepSpeed engine drives (and checkpoints)."""
        return [scheduler for scheduler in self._schedulers if not isinstance(scheduler, DeepSpeedSchedulerWrapper)]

    def _fsdp_parts(self) -> tuple[dict[int, torch.nn.Module], dict[int, torch.nn.Module]]:
        """The FSDP-sharded models by their index, and the sharded model each optimizer steps, by the optimizer's index.

        Rule: these are saved and loaded by `save_fsdp_model` /
        `save_fsdp_optimizer` and their loaders, as the plugin's
        ``state_dict_type`` says (every process takes part); the rest as
        without FSDP. Catalog: plugin.fsdp_state_dict.
        """
        unwrapped = {i: self.unwrap_model(model, keep_torch_compile=False) for i, model in enumerate(self._models)}
        sharded = {i: model for i, model in unwrapped.items() if is_fsdp_model(model)}
        owners = {}
        for index, optimizer in enumerate(self._optimizers):
            owner = optimizer_owner(optimizer, list(sharded.values()))
            if owner is not None:
                owners[index] = owner
        return sharded, owners

    def _publish(self, staging: str, target: str, token: str) -> bool:
        """Manifest, rename into place, clean up, enforce ``total_limit`` (the staging directory's creator)."""
        config = self.project_configuration
        store.write_manifest(staging, self.num_processes)
        store.publish(staging, target, token)
        parent, name = os.path.split(target)
        store.remove_leftovers(parent, None if config.automatic_checkpoint_naming else name, keep=token)
        if config.automatic_checkpoint_naming and config.total_limit is not None:
            store.prune(parent, config.total_limit, token)
        return True

    def _checkpoint_to_load(self, input_dir: Optional[PathLike]) -> str:
        """The checkpoint `load_state` reads (decided by the main process), checked before anything is loaded."""
        config = self.project_configuration
        if input_dir is not None:
            directory = store.resolve(os.path.expanduser(os.fspath(input_dir)))
        elif config.automatic_checkpoint_naming:
            folder = os.path.join(config.project_dir or "", store.CHECKPOINTS_FOLDER)
            published = store.published_in(folder)
            if not published:
                raise store.CheckpointError(f"no complete checkpoint to load in {folder}")
            directory = published[-1][1]
        else:
            raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")  # HF's words
        return directory

    def load_state(self, input_dir: Optional[PathLike] = None, load_kwargs: Optional[dict[str, Any]] = None, **load_model_func_kwargs: Any) -> None:
        """Restore what `save_state` saved: models, optimizers, schedulers, scaler, RNG states, positions, objects.

        Rules: from ``input_dir``, or with automatic checkpoint naming and
        no ``input_dir`` from the newest complete checkpoint in
        ``project_dir/checkpoints`` (a checkpoint still being written, or
        left by a crash, is never taken; HF accelerate's count too, see
        `_checkpointing.store`); ``project_configuration.iteration`` then
        continues after it. A folder HF wrote loads as one written here.
        Before anything is loaded the checkpoint must have been saved at
        this world size, hold every file intact and one
        ``custom_checkpoint_<i>.pkl`` per registered object: otherwise
        an error names the directory or file. Load hooks run first
        (`register_load_state_pre_hook`). The optimizer, scheduler and
        loader states are read with ``weights_only=True`` unless
        ``load_kwargs`` say otherwise; registered objects' states with
        ``weights_only=False``, as HF 1.15 reads them; ``map_location`` ("cpu" or "on_device") and the model
        loading options (``strict``) come in ``load_model_func_kwargs``,
        which go to DeepSpeed's ``load_checkpoint`` where engines train (a
        DeepSpeed engine loads its model, optimizer and scheduler itself).
        Prepared data loaders are positioned where they were: iterate
        `skip_first_batches(loader, batches_done)` for the rest of the
        epoch, then the loader, and the batches are those an uninterrupted
        run yields (from a folder HF wrote, which holds no position, the
        loader starts its epoch afresh, as HF's does). `step` is restored.
        A failure on any process fails the
        call on every process.
        Catalog: save_state.roundtrip, save_state.resume_data_order, save_state.auto_naming,
        save_state.pre_hooks, register_for_checkpointing, plugin.deepspeed_zero.
        """
        directory = self._from_main(self._agree("load_state", lambda: self.is_main_process and self._checkpoint_to_load(input_dir)))
        self._agree("load_state", lambda: self._check_loadable(directory))
        self._agree("load_state", lambda: self._read_state(directory, load_kwargs, load_model_func_kwargs))
        match = store.AUTOMATIC_NAME.fullmatch(os.path.basename(directory))
        if input_dir is None and match:
            self.project_configuration.iteration = int(match.group(1)) + 1

    def _check_loadable(self, directory: str) -> None:
        store.verify(directory, self.num_processes)
        check_custom_files(directory, len(self._custom_objects))

    def _read_state(self, directory: str, load_kwargs: Optional[dict[str, Any]], load_model_func_kwargs: dict[str, Any]) -> None:
        sharded, owners = self._fsdp_parts()
        engines = self._deepspeed_engines()
        models = [model for i, model in enumerate(self._models) if i not in sharded and i not in engines]
        for hook in list(self._load_model_state_pre_hook.values()):
            hook(models, directory)
        plugin = self._engines.fsdp_plugin
        for index, model in sharded.items():
            load_fsdp_model(plugin, self, model, directory, index)
        for index, model in owners.items():
            load_fsdp_optimizer(plugin, self, self._optimizers[index], model, directory, index)
        options = dict(load_model_func_kwargs)
        map_location = options.pop("map_location", None)
        for index, engine in engines.items():  # the model options are DeepSpeed's where engines train
            load_engine_checkpoint(engine, directory, index, **options)
        restored = load_accelerator_state(
            directory,
            [self.unwrap_model(model) for model in models],
            self._optimizers_saved_here(owners),
            self._schedulers_saved_here(),
            self._dataloaders,
            self.process_index,
            self.scaler,
            map_location,
            load_kwargs,
            **({} if engines else options),
        )
        for index, obj in enumerate(self._custom_objects):
            load_custom_state(obj, directory, index)
        if "step" in restored:
            self.step = restored["step"]


def _remove_stale_weights(directory: str, weights_name: str, index_name: str, keep: set[str]) -> None:
    """Remove weights files of ``weights_name``'s kind (single, shards, index) that ``keep`` does not name."""
    stem, extension = os.path.splitext(weights_name)
    shard = re.compile(re.escape(stem) + r"-\d{5}-of-\d{5}" + re.escape(extension))
    for name in os.listdir(directory):
        ours = name in (weights_name, index_name) or shard.fullmatch(name)
        if ours and name not in keep:
            os.remove(os.path.join(directory, name))
