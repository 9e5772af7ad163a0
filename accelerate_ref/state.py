"""Process state: who am I, how many of us are there, and on which device.

`PartialState` holds the launch topology and the process-control helpers;
`AcceleratorState` adds what an `Accelerator` configures (mixed precision,
plugins); `GradientState` tracks gradient synchronisation. Each is a
process-wide shared state (every instance sees the same attributes), reset
with ``_reset_state`` as HF accelerate's own tests do.
"""

from __future__ import annotations

import atexit
import builtins
import os
import threading
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, TypeVar

import torch

from .families import DeviceFamily, LaunchEnv, detect
from .utils.dataclasses import DistributedType, GradientAccumulationPlugin, PrecisionType
from .utils.environment import parse_flag_from_env

F = TypeVar("F", bound=Callable[..., Any])
Splittable = TypeVar("Splittable", list, tuple, dict, torch.Tensor)


class _SharedState:
    """Base for the singletons: every instance shares one attribute dict."""

    _shared_state: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._shared_state = {}

    def _attach(self) -> bool:
        """Share the class-wide dict; return whether it was already initialised."""
        self.__dict__ = self._shared_state
        return bool(self._shared_state)

    @property
    def initialized(self) -> bool:
        return bool(self._shared_state)

    def __getattr__(self, name: str) -> Any:
        state = type(self).__name__
        if self._shared_state:
            raise AttributeError(f"'{state}' object has no attribute '{name}'")
        raise AttributeError(  # HF's words
            f"`{state}` object has no attribute `{name}`. This happens if `{state}._reset_state()` was called and "
            f"an `Accelerator` or `{state}` was not reinitialized."
        )


def is_initialized() -> bool:
    """Whether the `AcceleratorState` has been initialised (`AcceleratorState().initialized` without an instance)."""
    return bool(AcceleratorState._shared_state)


def do_nothing(*args: Any, **kwargs: Any) -> None:
    """Accept anything, do nothing, return None (HF 1.15's placeholder callable)."""
    return None


class ThreadLocalSharedDict(threading.local):
    """A descriptor holding one dict per thread, shared by every instance of the owning class.

    Rule (HF 1.15): reading the attribute, on the class or an instance, gives
    this thread's dict; assigning it on an instance replaces that dict. HF uses
    it as `_shared_state` for XLA's multithreaded PJRT ranks.
    """

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value


class PartialState(_SharedState):
    """Launch topology and process control, usable without an `Accelerator`.

    Detection (catalog ``state.attributes``):

    * no torchrun-style environment, or ``WORLD_SIZE=1``: one process,
      ``DistributedType.NO``;
    * ``WORLD_SIZE>1`` on CPU: ``MULTI_CPU`` over gloo, with no extra flag;
    * ``WORLD_SIZE>1`` with CUDA: ``MULTI_GPU`` over nccl (``cpu=True`` forces CPU).

    ``ACCELERATE_TORCH_DEVICE`` (``cpu``, ``cpu:64``, ``meta``, ...), when set,
    is the device as given, in place of the family's, as in HF accelerate.

    ``kwargs`` go to ``torch.distributed.init_process_group`` (see
    ``InitProcessGroupKwargs``); ``backend`` overrides the family's default.
    """

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if self._attach():
            return
        cpu = cpu or parse_flag_from_env("ACCELERATE_USE_CPU")
        family = detect(cpu=cpu)
        launch = LaunchEnv.from_environ()
        backend = kwargs.pop("backend", None)
        self._cpu = cpu
        self.fork_launched = parse_flag_from_env("FORK_LAUNCHED")  # HF's notebook_launcher sets it in its forked ranks
        self.family: DeviceFamily = family
        self.debug = parse_flag_from_env("ACCELERATE_DEBUG_MODE")
        env_device = os.environ.get("ACCELERATE_TORCH_DEVICE")
        if launch.is_distributed:
            self.device = torch.device(env_device) if env_device else family.device(launch.local_rank, distributed=True)
            family.init_process_group(launch, backend, **kwargs)
            _tear_down_at_exit()
            self.backend = backend or family.backend
            self.distributed_type = family.distributed_type
            self.num_processes, self.process_index, self.local_process_index = family.world(launch)
        else:
            self.device = torch.device(env_device) if env_device else family.device(0, distributed=False)
            self.backend = None
            self.distributed_type = DistributedType.NO
            self.num_processes, self.process_index, self.local_process_index = 1, 0, 0

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{'  Backend: ' + self.backend if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    @staticmethod
    def _reset_state() -> None:
        """Forget the state (the process group, if any, stays up for reuse)."""
        PartialState._shared_state.clear()

    # -- topology ---------------------------------------------------------

    @property
    def use_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """True on exactly one rank overall (catalog ``process.is_main``)."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on exactly one rank per machine (catalog ``process.is_local_main``)."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the rank with the highest index."""
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        """The device the detected family would use on this rank."""
        return self.device

    # -- synchronisation --------------------------------------------------

    def wait_for_everyone(self) -> None:
        """No rank returns before every rank has called it; a no-op alone.

        Catalog: ``sync.wait_for_everyone``.
        """
        if self.use_distributed:
            self.family.barrier()

    @contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block and leaves it before any other rank enters.

        Catalog: ``sync.main_process_first``.
        """
        with self._goes_first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """As `main_process_first`, per machine with local rank 0.

        Catalog: ``sync.local_main_process_first``.
        """
        with self._goes_first(self.is_local_main_process):
            yield

    # -- splitting inputs -------------------------------------------------

    @contextmanager
    def split_between_processes(self, inputs: Splittable, apply_padding: bool = False) -> Iterator[Splittable]:
        """Yield this rank's contiguous share of ``inputs``.

        Shares differ by at most one item; earlier ranks take the extras
        (["A","B","C"] on 2 ranks: ["A","B"] and ["C"]). With
        ``apply_padding`` every share is as long as the longest, filled with
        the last item of the whole input, so that results can be gathered.
        Tensors split on dim 0; dicts split value-wise and need values of
        equal length. Catalog: ``split.doc_example``, ``split.padding``,
        ``split.tensor_dict``, ``split.fewer_inputs_than_ranks``.
        """
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    # -- running on some ranks only ---------------------------------------

    def _only_if(self, function: F | None, should_run: Callable[["PartialState"], bool], **decorator_kwargs: Any):
        """Decorate ``function`` so that it runs only where ``should_run(state)``."""

        def decorate(fn: F) -> F:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if should_run(self):
                    return fn(*args, **kwargs)
                return None

            wrapper.__name__ = getattr(fn, "__name__", "wrapper")
            wrapper.__doc__ = fn.__doc__
            wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
            return wrapper  # type: ignore[return-value]

        return decorate if function is None else decorate(function)

    def on_main_process(self, function: F | None = None) -> F:
        """Run the decorated function on rank 0 only (once overall, not per machine).

        Catalog: ``process.on_main_process`` (erratum: the example's docstring says "once per server").
        """
        return self._only_if(function, lambda s: s.is_main_process)

    def on_local_main_process(self, function: F | None = None) -> F:
        """Run the decorated function on local rank 0 of each machine.

        Catalog: ``process.on_local_main_process``.
        """
        return self._only_if(function, lambda s: s.is_local_main_process)

    def on_last_process(self, function: F) -> F:
        """Run the decorated function on the last rank only. Catalog: ``process.on_last_process``."""
        return self._only_if(function, lambda s: s.is_last_process)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> F:
        """Run the decorated function on rank ``process_index`` only. Catalog: ``process.on_process``."""
        if function is None:
            return partial(self.on_process, process_index=process_index)  # type: ignore[return-value]
        _require_index("process_index", process_index)
        return self._only_if(function, lambda s: s.process_index == process_index)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> F:
        """Run the decorated function on local rank ``local_process_index`` of each machine.

        Catalog: ``process.on_local_process`` (erratum: the overview spells the
        keyword ``local_process_idx``; the signature is ``local_process_index``).
        """
        if function is None:
            return partial(self.on_local_process, local_process_index=local_process_index)  # type: ignore[return-value]
        _require_index("local_process_index", local_process_index)
        return self._only_if(function, lambda s: s.local_process_index == local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print once per machine, on its local main process.

        Catalog: ``print.once_per_server`` (erratum: also described as "once per process").
        """
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Tear down the process group (the default one unless ``group`` is given).

        The explicit way to end a distributed script (`Accelerator.end_training`
        calls it); a script that does not call it is torn down at interpreter
        exit all the same (catalog ``state.clean_exit``).
        """
        if self.fork_launched and group is None:
            return  # HF 1.15: the forked ranks' launcher owns the default group
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group(group)

    def set_device(self) -> None:
        """Set `device` from the launch when it is unset (``None``); a no-op otherwise, as in HF 1.15.

        The device is the CPU with ``cpu=True``, else the family's device for
        this rank's local index.
        """
        if self.device is not None:
            return
        self.device = (torch.device("cpu") if self._cpu
                       else self.family.device(self.local_process_index, distributed=self.use_distributed))


_teardown_registered = False


def _tear_down_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, before it finalizes.

    A gloo worker thread can still hold the last reference to a finished
    collective's work, and so to that collective's tensors. If it lets them go
    after Python has begun finalizing, the decref needs the GIL, Python ends the
    thread instead (``pthread_exit``), the unwind meets a ``noexcept`` C++
    destructor and the whole rank aborts with SIGABRT ("terminate called
    without an active exception"): a script that did all its work is reported
    failed. ``atexit`` callbacks run before finalization starts, and destroying
    the group joins its worker threads there, while they can still take the
    GIL. Catalog: ``state.clean_exit``.
    """
    global _teardown_registered
    if not _teardown_registered:
        atexit.register(_destroy_default_group)
        _teardown_registered = True


def _destroy_default_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _require_index(name: str, value: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")


def _split(inputs: Any, num_processes: int, index: int, apply_padding: bool) -> Any:
    """The share of ``inputs`` that rank ``index`` of ``num_processes`` gets (see `split_between_processes`)."""
    if isinstance(inputs, dict):
        lengths = {key: len(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"split_between_processes needs dict values of equal length, got lengths {lengths}")
        return {key: _split(value, num_processes, index, apply_padding) for key, value in inputs.items()}
    if not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise TypeError(
            f"split_between_processes splits a list, tuple, dict or tensor, got {type(inputs).__name__}"
        )
    per_process, extras = divmod(len(inputs), num_processes)
    start = index * per_process + min(index, extras)
    end = start + per_process + (1 if index < extras else 0)
    share = inputs[start:end]
    longest = per_process + (1 if extras else 0)
    missing = longest - (end - start)
    if not apply_padding or missing == 0 or len(inputs) == 0:
        return share
    if isinstance(inputs, torch.Tensor):
        return torch.cat([share, inputs[-1:].expand(missing, *inputs.shape[1:])])
    return share + type(share)([inputs[-1]] * missing)


class AcceleratorState(_SharedState):
    """`PartialState` plus what an `Accelerator` configures.

    ``mixed_precision`` defaults to ``ACCELERATE_MIXED_PRECISION`` (else
    ``"no"``); catalog ``mixed_precision.env_default``. Attribute reads that
    are not found here fall through to the `PartialState`.
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,
        **kwargs: Any,
    ) -> None:
        if self._attach():
            # HF's wording, so `pytest.raises(match=...)` checks written for accelerate keep working.
            refusal = ("AcceleratorState has already been initialized and cannot be changed, restart your runtime "
                       "completely and pass `{flag}` to `Accelerator()`.")
            if cpu and self.device.type != "cpu":
                raise ValueError(refusal.format(flag="cpu=True"))
            if mixed_precision is not None and mixed_precision != self._mixed_precision:
                raise ValueError(refusal.format(flag=f"mixed_precision='{mixed_precision}'")
                                 + f" (it has mixed_precision='{self._mixed_precision}')")
            return
        self._partial = PartialState(cpu, **kwargs)
        self._mixed_precision = _precision(mixed_precision)
        self.dynamo_plugin = dynamo_plugin
        self.deepspeed_plugins = deepspeed_plugin
        self.fsdp_plugin = fsdp_plugin
        self.megatron_lm_plugin = megatron_lm_plugin
        self.torch_tp_plugin = torch_tp_plugin
        self.parallelism_config = parallelism_config

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not self._shared_state:
            return super().__getattr__(name)
        return getattr(self._partial, name)

    def __repr__(self) -> str:
        return repr(self._partial) + f"Mixed precision type: {self.mixed_precision}\n"

    @property
    def mixed_precision(self) -> str:
        return self._mixed_precision

    @property
    def is_fsdp2(self) -> bool:
        """Whether an FSDP plugin with ``fsdp_version=2`` shards this run's models (several processes). Catalog: plugin.fsdp."""
        plugin = getattr(self, "fsdp_plugin", None)
        return plugin is not None and plugin.fsdp_version == 2 and self.use_distributed

    @property
    def use_distributed(self) -> bool:
        return self._partial.use_distributed

    @property
    def is_main_process(self) -> bool:
        return self._partial.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._partial.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self._partial.is_last_process

    # -- DeepSpeed plugins (catalog plugin.deepspeed_config) ----------------------------------

    @property
    def deepspeed_plugin(self) -> Any:
        """The active `DeepSpeedPlugin` (the selected one of several), or None without DeepSpeed."""
        plugins = self.__dict__.get("deepspeed_plugins")
        if plugins is None or not isinstance(plugins, dict):
            return plugins
        return next(plugin for plugin in plugins.values() if plugin.selected)

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The plugin ``Accelerator(deepspeed_plugins={name: plugin, ...})`` named ``name``."""
        return self.deepspeed_plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin named ``name`` the active one (what the next `prepare` uses); unselect the others."""
        plugins = self.deepspeed_plugins
        if not isinstance(plugins, dict) or name not in plugins:
            known = sorted(plugins) if isinstance(plugins, dict) else []
            raise ValueError(f"select_deepspeed_plugin: no DeepSpeed plugin named {name!r} (the Accelerator has {known})")
        for plugin in plugins.values():
            plugin._unselect()
        plugins[name].select(_from_accelerator_state=True)

    # -- HF 1.15's AcceleratorState members that act through the PartialState --

    @property
    def fork_launched(self) -> bool:
        return PartialState().fork_launched

    def wait_for_everyone(self) -> None:
        """`PartialState.wait_for_everyone`. Catalog: ``sync.wait_for_everyone``."""
        PartialState().wait_for_everyone()

    @contextmanager
    def split_between_processes(self, inputs: Splittable, apply_padding: bool = False) -> Iterator[Splittable]:
        """`PartialState.split_between_processes`. Catalog: ``split.doc_example``."""
        with PartialState().split_between_processes(inputs, apply_padding=apply_padding) as split:
            yield split

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """`PartialState.main_process_first`."""
        with PartialState().main_process_first():
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """`PartialState.local_main_process_first`."""
        with PartialState().local_main_process_first():
            yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`PartialState.print`: once per machine. Catalog: ``print.once_per_server``."""
        PartialState().print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """`PartialState.destroy_process_group` (nothing for the default group of forked ranks)."""
        PartialState().destroy_process_group(group)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the accelerator state, and the partial state too if asked."""
        AcceleratorState._shared_state.clear()
        if reset_partial_state:
            PartialState._reset_state()


def _precision(value: str | None) -> str:
    """Validate a mixed-precision name, reading ``ACCELERATE_MIXED_PRECISION`` when none is given."""
    value = value if value is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    value = str(value).lower()
    valid = [member.value for member in PrecisionType]
    if value not in valid:
        raise ValueError(f"Unknown mixed_precision mode: {value}. Choose between {valid}")  # HF's words
    return value


class GradientState(_SharedState):
    """Whether gradients are synchronised on this step, and the data loaders being iterated.

    Outside gradient accumulation every step syncs (``sync_gradients`` True).
    Prepared data loaders register themselves here while they are iterated
    (`_add_dataloader` / `_remove_dataloader`); the innermost one is the
    ``active_dataloader``, and ``end_of_dataloader`` / ``remainder`` are read
    from it: True on its last batch, and the number of real samples in its
    last global batch (``-1`` when unknown or outside any loader). That is
    how `Accelerator.gather_for_metrics` drops the samples ``even_batches``
    duplicated. Loaders are held by weak reference, so a loader that is
    dropped mid-epoch does not stay registered.
    Catalog: gather_for_metrics.doc_example, gather_for_metrics.full_epoch,
    accumulate.end_of_dataloader, accumulate.scheduler, accumulate.plugin.
    """

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        if self._attach():
            if gradient_accumulation_plugin is not None:
                self.plugin = gradient_accumulation_plugin
            return
        self.plugin = gradient_accumulation_plugin or GradientAccumulationPlugin(num_steps=1)
        self.sync_gradients = True
        self._is_xla_gradients_synced = False
        self._dataloader_references_ref: list[weakref.ref] = []

    @property
    def is_xla_gradients_synced(self) -> bool:
        """Whether XLA gradients were reduced this step; always True under FSDP (``ACCELERATE_USE_FSDP``), as HF 1.15."""
        return parse_flag_from_env("ACCELERATE_USE_FSDP") or self._is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, is_synced: bool) -> None:
        self._is_xla_gradients_synced = is_synced

    # -- accumulation settings, from the plugin ----------------------------

    @property
    def num_steps(self) -> int:
        """Batches per optimizer update (``num_steps=None`` in the plugin means 1)."""
        return self.plugin.num_steps or 1

    @property
    def adjust_scheduler(self) -> bool:
        """False, whatever the plugin says, as HF 1.15 reads it.

        HF keeps only the plugin's settings that differ from their defaults
        and reads a missing ``adjust_scheduler`` as False, so its default
        (True) reads False too; a prepared scheduler then leaves accumulating
        micro-batches uncounted (`scheduler.AcceleratedScheduler`).
        """
        return False

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether gradients sync on the last batch of a loader, mid-cycle included."""
        return self.plugin.sync_with_dataloader

    @property
    def sync_each_batch(self) -> bool:
        """Whether gradients sync on every batch even while accumulating."""
        return self.plugin.sync_each_batch

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        """Set whether the current step synchronises gradients (the Accelerator calls it)."""
        self.sync_gradients = sync_gradients

    # -- data loaders being iterated -----------------------------------------

    @property
    def dataloader_references(self) -> list[Any]:
        """The loaders being iterated, outermost first (loaders garbage-collected since are left out)."""
        loaders = (reference() for reference in self._dataloader_references_ref)
        return [loader for loader in loaders if loader is not None]

    @dataloader_references.setter
    def dataloader_references(self, loaders: list[Any]) -> None:
        self._dataloader_references_ref = [weakref.ref(loader) for loader in loaders]

    @property
    def active_dataloader(self) -> Any:
        """The innermost loader being iterated, or None."""
        loaders = self.dataloader_references
        return loaders[-1] if loaders else None

    @property
    def in_dataloader(self) -> bool:
        """Whether some prepared loader is being iterated."""
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        """True while the active loader's last batch is out; False outside any loader."""
        active = self.active_dataloader
        return bool(active is not None and active.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the active loader's last global batch; -1 when unknown or outside any loader."""
        active = self.active_dataloader
        return -1 if active is None else active.remainder

    def _add_dataloader(self, dataloader: Any) -> None:
        """Register ``dataloader`` as the active loader (a loader calls it when an epoch starts)."""
        self.dataloader_references = self.dataloader_references + [dataloader]

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Unregister ``dataloader`` (a loader calls it when its epoch ends)."""
        self.dataloader_references = [loader for loader in self.dataloader_references if loader is not dataloader]

    @staticmethod
    def _reset_state() -> None:
        GradientState._shared_state.clear()
