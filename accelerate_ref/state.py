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

from .families import FAMILIES, DeviceFamily, LaunchEnv, detect
from .utils.dataclasses import ACCELERATOR_WORLD_TYPES, DistributedType, DynamoBackend, GradientAccumulationPlugin
from .utils.environment import parse_flag_from_env, set_numa_affinity
from .utils.imports import is_fp8_available

F = TypeVar("F", bound=Callable[..., Any])
Splittable = TypeVar("Splittable", list, tuple, dict, torch.Tensor)


class _SharedState:
    """Base for the singletons: every instance shares one attribute dict.

    Reading an attribute the state does not hold is HF 1.15's AttributeError:
    for one of ``_known_attrs`` (what an initialised state holds) it says the
    state was reset and not reinitialised, for any other name it is Python's
    usual message.
    """

    _shared_state: dict[str, Any]
    #: The attributes an initialised state holds (HF 1.15's lists).
    _known_attrs: list[str] = []

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
        if name in self._known_attrs:
            raise AttributeError(  # HF's words
                f"`{state}` object has no attribute `{name}`. This happens if `{state}._reset_state()` was called and "
                "an `Accelerator` or `PartialState` was not reinitialized."
            )
        raise AttributeError(f"'{state}' object has no attribute '{name}'")


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

    ``ACCELERATE_CPU_AFFINITY`` true pins the process to the CPUs nearest its
    GPU once the state is set up (HF 1.15: `utils.environment.set_numa_affinity`
    of the local process index, looked up in this module; a no-op without CUDA;
    an ImportError on CUDA without `pynvml`).

    ``kwargs`` go to ``torch.distributed.init_process_group`` (see
    ``InitProcessGroupKwargs``); ``backend`` overrides the family's default
    where the family can run it (`DeviceFamily.backend_for`), else it is HF
    1.15's ValueError naming the backend to use.
    """

    #: HF 1.15's list, and ``family`` (the reference's device family, held by an initialised state too), so that
    #: code reaching it after a reset gets HF's message (HF's test_script.py: test_reinstantiated_state).
    _known_attrs = ["_cpu", "_mixed_precision", "_shared_state", "backend", "debug", "device", "distributed_type",
                    "family", "fork_launched", "local_process_index", "num_processes", "process_index"]

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
            resolved = family.backend_for(backend)
            if backend is not None and resolved != backend:
                raise ValueError(f"Your assigned backend {backend} is not available, please use {resolved}")
            self.device = torch.device(env_device) if env_device else family.device(launch.local_rank, distributed=True)
            family.init_process_group(launch, resolved, **kwargs)
            _tear_down_at_exit()
            self.backend = resolved
            self.distributed_type = family.distributed_type
            self.num_processes, self.process_index, self.local_process_index = family.world(launch)
        else:
            self.device = torch.device(env_device) if env_device else family.device(0, distributed=False)
            self.backend = None
            self.distributed_type = DistributedType.NO
            self.num_processes, self.process_index, self.local_process_index = 1, 0, 0
        if parse_flag_from_env("ACCELERATE_CPU_AFFINITY", False):  # `accelerate launch --enable_cpu_affinity`
            set_numa_affinity(self.local_process_index)

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
        """True on exactly one rank overall (catalog ``process.is_main``); under Megatron-LM the last rank."""
        if self.distributed_type == DistributedType.MEGATRON_LM:
            return self.is_last_process
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on exactly one rank per machine (catalog ``process.is_local_main``); under Megatron-LM the last rank."""
        if self.distributed_type == DistributedType.MEGATRON_LM:
            return self.is_last_process
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """True on the rank with the highest index."""
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        """The type of device this machine offers (``cuda``, ``npu``, else ``cpu``), without an index, as HF 1.15.

        It ignores ``cpu=True`` and the launch: what the hardware has, not what this process runs on.
        """
        family = next(family for family in FAMILIES if family.name != "xla" and family.is_available())
        return torch.device(family.name)

    # -- synchronisation --------------------------------------------------

    def wait_for_everyone(self) -> None:
        """No rank returns before every rank has called it; a no-op alone.

        Catalog: ``sync.wait_for_everyone``.
        """
        if self.distributed_type != DistributedType.NO and self.use_distributed:
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
        the last item of the whole input, so that results can be gathered
        (a padded tensor share is on this process's device). Lists, tuples
        and tensors split on dim 0; dicts split value-wise and need values of
        equal length (HF 1.15's ValueError); anything else with a length
        (a string, a range) is every rank's whole. On one process the input
        comes back as it is, as in HF 1.15, except that a dict of unequal
        values is refused there too (catalog split.tensor_dict; HF 1.15
        returns it). Catalog: ``split.doc_example``, ``split.padding``,
        ``split.tensor_dict``, ``split.fewer_inputs_than_ranks``.
        """
        if self.num_processes == 1:
            if isinstance(inputs, dict):
                _common_length(inputs)
            yield inputs
            return
        yield _split(inputs, self.num_processes, self.process_index, apply_padding, self.device)

    # -- running on some ranks only ---------------------------------------
    # Rule (HF 1.15): each decorator returns the function itself where it is to run (or on a single
    # process), else `do_nothing`; the decision is taken when decorating.

    def on_main_process(self, function: F | None = None) -> F:
        """Run the decorated function on rank 0 only (once overall, not per machine).

        A state reset since construction is HF 1.15's ValueError.
        Catalog: ``process.on_main_process`` (erratum: the example's docstring says "once per server").
        """
        if not self.initialized:
            raise ValueError("The `PartialState` or `Accelerator` must be initialized before calling this function.")
        return function if self.is_main_process or not self.use_distributed else do_nothing

    def on_local_main_process(self, function: F | None = None) -> F:
        """Run the decorated function on local rank 0 of each machine.

        Catalog: ``process.on_local_main_process``.
        """
        return function if self.is_local_main_process or not self.use_distributed else do_nothing

    def on_last_process(self, function: F) -> F:
        """Run the decorated function on the last rank only. Catalog: ``process.on_last_process``."""
        return function if self.is_last_process or not self.use_distributed else do_nothing

    def on_process(self, function: F | None = None, process_index: int | None = None) -> F:
        """Run the decorated function on rank ``process_index`` only. Catalog: ``process.on_process``."""
        if function is None:
            return partial(self.on_process, process_index=process_index)  # type: ignore[return-value]
        return function if self.process_index == process_index or not self.use_distributed else do_nothing

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> F:
        """Run the decorated function on local rank ``local_process_index`` of each machine.

        Catalog: ``process.on_local_process`` (erratum: the overview spells the
        keyword ``local_process_idx``; the signature is ``local_process_index``).
        """
        if function is None:
            return partial(self.on_local_process, local_process_index=local_process_index)  # type: ignore[return-value]
        if self.local_process_index == local_process_index or not self.use_distributed:
            return function
        return do_nothing

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


def _split(inputs: Any, num_processes: int, index: int, apply_padding: bool, device: torch.device) -> Any:
    """The share of ``inputs`` that rank ``index`` of ``num_processes`` gets (see `split_between_processes`).

    The length is ``len(inputs)`` (Python's TypeError without one), for a
    dict that of its values.
    """
    length = _common_length(inputs) if isinstance(inputs, dict) else len(inputs)
    per_process, extras = divmod(length, num_processes)
    start = index * per_process + min(index, extras)
    end = start + per_process + (1 if index < extras else 0)
    return _share(inputs, start, end, per_process + (1 if extras else 0), apply_padding, device)


def _common_length(inputs: dict) -> int:
    """The length of a dict's first value, which every value must have (HF 1.15's ValueError)."""
    length = len(inputs[list(inputs)[0]])
    if not all(len(value) == length for value in inputs.values()):
        raise ValueError("All values in the dictionary must have the same length")
    return length


def _share(inputs: Any, start: int, end: int, longest: int, apply_padding: bool, device: torch.device) -> Any:
    """``inputs[start:end]``, value-wise for a dict, padded to ``longest`` with the last item when asked.

    Padding reads the last item even when nothing is missing (an empty input
    is Python's IndexError, as in HF 1.15). HF cannot pad a tuple (its
    ``result += [...]`` is a TypeError); the reference pads it as a list
    (catalog split.padding).
    """
    if isinstance(inputs, dict):
        return {key: _share(value, start, end, longest, apply_padding, device) for key, value in inputs.items()}
    if not isinstance(inputs, (list, tuple, torch.Tensor)):
        return inputs
    share = inputs[start:end]
    if not apply_padding:
        return share
    last = inputs[-1]
    if isinstance(inputs, torch.Tensor):
        share = share.to(device)
        return torch.cat([share, last.to(device).expand(longest - len(share), *inputs.shape[1:])])
    return share + type(share)([last] * (longest - len(share)))


class AcceleratorState(_SharedState):
    """`PartialState` plus what an `Accelerator` configures.

    Rules (HF 1.15): its attributes start as a copy of the `PartialState`'s
    (made first if need be; ``cpu`` or ``ACCELERATE_USE_CPU``), refreshed at
    each construction; the first construction must come from an
    `Accelerator` (``_from_accelerator=True``), else HF's ValueError, raised
    after the process state and the plugins are set. ``mixed_precision`` is
    lower-cased; left out, it is ``ACCELERATE_MIXED_PRECISION`` as written
    (else ``"no"``; catalog ``mixed_precision.env_default``); ``"fp8"``
    without an FP8 engine is HF's ValueError. Once built, ``cpu=True`` on a
    state that is not on the CPU, or another precision, is HF's ValueError.
    ``fsdp_plugin`` and ``megatron_lm_plugin`` are attributes only when
    given; reading a missing one is HF's AttributeError. With an
    ``fsdp_plugin`` on several accelerators (``MULTI_GPU``, ``MULTI_NPU``,
    ...) the ``distributed_type`` is ``FSDP``, with DeepSpeed plugins
    ``DEEPSPEED`` (unless ``cpu``), the `PartialState`'s too; CPU ranks keep
    theirs under FSDP and XLA ranks under both, as in HF. The dynamo plugin
    is required (without one, reading its backend is HF's AttributeError);
    with a compiling backend, an fp32 run on CUDA turns TF32 matmuls on.
    """

    _known_attrs = PartialState._known_attrs + ["deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin",
                                                "dynamo_plugin"]

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
        self.__dict__ = self._shared_state
        cpu = cpu or parse_flag_from_env("ACCELERATE_USE_CPU")
        if not PartialState._shared_state:
            PartialState(cpu, **kwargs)
        self.__dict__.update(PartialState._shared_state)
        if self.initialized:
            self._take_engine_type()
            self._check_unchanged(mixed_precision, cpu)
            return
        self.deepspeed_plugins = deepspeed_plugin
        self.torch_tp_plugin = torch_tp_plugin
        self.parallelism_config = parallelism_config
        self.device_mesh = None
        mixed_precision = requested_precision(mixed_precision)
        if mixed_precision == "fp8" and not is_fp8_available():
            raise ValueError("Using `fp8` precision requires `transformer_engine` or `MS-AMP` to be installed.")
        self.dynamo_plugin = dynamo_plugin
        if not _from_accelerator:
            raise ValueError(
                "Please make sure to properly initialize your accelerator via `accelerator = Accelerator()` "
                "before using any functionality from the `accelerate` library."
            )
        self._mixed_precision = mixed_precision
        if fsdp_plugin is not None:
            self.fsdp_plugin = fsdp_plugin
        self._take_engine_type()
        if megatron_lm_plugin is not None:
            self.megatron_lm_plugin = megatron_lm_plugin
        if self.dynamo_plugin.backend != DynamoBackend.NO and mixed_precision == "no" and self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True  # HF 1.15: compiled fp32 runs take TF32 matmuls

    def _take_engine_type(self) -> None:
        """The engine's distributed type, the `PartialState`'s too (HF's rules): ``DEEPSPEED`` with DeepSpeed
        plugins unless the run is forced onto the CPU; ``FSDP`` for a sharded run on accelerators (CPU ranks
        keep theirs)."""
        engine = None
        if self.__dict__.get("deepspeed_plugins") is not None and not self.__dict__.get("_cpu"):
            engine = DistributedType.DEEPSPEED
        elif self.__dict__.get("fsdp_plugin") is not None and self.distributed_type in ACCELERATOR_WORLD_TYPES:
            engine = DistributedType.FSDP
        if engine is not None and self.distributed_type != DistributedType.XLA:
            self.distributed_type = PartialState._shared_state["distributed_type"] = engine

    @property
    def initialized(self) -> bool:
        """Whether an Accelerator configured this state (it holds more than the `PartialState`'s copy)."""
        return self._shared_state != PartialState._shared_state

    def _check_unchanged(self, mixed_precision: str | None, cpu: bool) -> None:
        """A built state cannot move to the CPU or change its precision (HF's words)."""
        refusal = ("AcceleratorState has already been initialized and cannot be changed, restart your runtime "
                   "completely and pass `{flag}` to `Accelerator()`.")
        if cpu and self.device.type != "cpu":
            raise ValueError(refusal.format(flag="cpu=True"))
        if mixed_precision is not None and mixed_precision != self._mixed_precision:
            raise ValueError(refusal.format(flag=f"mixed_precision='{mixed_precision}'"))

    def __repr__(self) -> str:
        text = repr(PartialState()) + f"\nMixed precision type: {self.mixed_precision}\n"
        if self.deepspeed_plugin is not None:
            text += f"ds_config: {self.deepspeed_plugin.deepspeed_config}\n"
        return text

    @property
    def mixed_precision(self) -> str:
        return self._mixed_precision

    @property
    def is_fsdp2(self) -> bool:
        """Whether an FSDP plugin with ``fsdp_version=2`` shards this run's models (several processes). Catalog: plugin.fsdp."""
        plugin = self.__dict__.get("fsdp_plugin")
        return plugin is not None and plugin.fsdp_version == 2 and self.use_distributed

    @property
    def use_distributed(self) -> bool:
        return PartialState().use_distributed

    @property
    def is_main_process(self) -> bool:
        return PartialState().is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return PartialState().is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return PartialState().is_last_process

    # -- DeepSpeed plugins (catalog plugin.deepspeed_config) ----------------------------------

    @property
    def deepspeed_plugin(self) -> Any:
        """The active `DeepSpeedPlugin` (the selected one of several), or None without DeepSpeed."""
        plugins = self.__dict__.get("deepspeed_plugins")
        if plugins is None or not isinstance(plugins, dict):
            return plugins
        return next(plugin for plugin in plugins.values() if plugin.selected)

    def _require_deepspeed(self) -> None:
        if self.deepspeed_plugins is None:
            raise ValueError(  # HF's `deepspeed_required` words
                "DeepSpeed is not enabled, please make sure that an `Accelerator` is configured for `deepspeed` "
                "before calling this function."
            )

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The plugin ``Accelerator(deepspeed_plugins={name: plugin, ...})`` named ``name`` (KeyError for another)."""
        self._require_deepspeed()
        return self.deepspeed_plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin named ``name`` the active one (what the next `prepare` uses); unselect the others.

        An unknown name is a KeyError, once the others are unselected (as HF 1.15).
        """
        self._require_deepspeed()
        for key, plugin in self.deepspeed_plugins.items():
            if key != name:
                plugin._unselect()
        self.deepspeed_plugins[name].select(_from_accelerator_state=True)

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


def requested_precision(value: str | None) -> str:
    """The precision a state runs when ``value`` is asked for: lower-cased, else ``ACCELERATE_MIXED_PRECISION``
    as written (default ``"no"``), unvalidated as in HF 1.15 (`Accelerator` checks its argument)."""
    return os.environ.get("ACCELERATE_MIXED_PRECISION", "no") if value is None else value.lower()


class GradientState(_SharedState):
    """Whether gradients are synchronised on this step, and the data loaders being iterated.

    Outside gradient accumulation every step syncs (``sync_gradients`` True).
    The accumulation settings are the `GradientAccumulationPlugin`'s
    ``to_kwargs()`` (the values that differ from its defaults) in
    ``plugin_kwargs``, read with HF 1.15's defaults: ``num_steps`` 1,
    ``adjust_scheduler`` False (so a plugin's default True reads False too),
    ``sync_with_dataloader`` True, ``sync_each_batch`` False; a later
    construction with another plugin replaces them. Prepared data loaders
    register themselves here while they are iterated (`_add_dataloader` /
    `_remove_dataloader`; the list starts as ``[None]``); the last one is the
    ``active_dataloader``, and ``end_of_dataloader`` / ``remainder`` are read
    from it: True on its last batch, and the number of real samples in its
    last global batch (``-1`` when unknown or outside any loader). That is
    how `Accelerator.gather_for_metrics` drops the samples ``even_batches``
    duplicated. Loaders are held by weak reference: one dropped mid-epoch
    reads as None. Catalog: gather_for_metrics.doc_example,
    gather_for_metrics.full_epoch, accumulate.end_of_dataloader,
    accumulate.scheduler, accumulate.plugin.
    """

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        plugin_kwargs = gradient_accumulation_plugin.to_kwargs() if gradient_accumulation_plugin is not None else {}
        if not self._attach():
            self.sync_gradients = True
            self._dataloader_references_ref: list[weakref.ref | None] = [None]
            self.plugin_kwargs = plugin_kwargs
            self._is_xla_gradients_synced = False
        if gradient_accumulation_plugin is not None:
            self.plugin_kwargs = plugin_kwargs

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self.plugin_kwargs}\n"
        )

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
        """Batches per optimizer update."""
        return self.plugin_kwargs.get("num_steps", 1)

    @property
    def adjust_scheduler(self) -> bool:
        """Whether a prepared scheduler counts accumulating micro-batches (`scheduler.AcceleratedScheduler`)."""
        return self.plugin_kwargs.get("adjust_scheduler", False)

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether gradients sync on the last batch of a loader, mid-cycle included."""
        return self.plugin_kwargs.get("sync_with_dataloader", True)

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        """Set whether the current step synchronises gradients (the Accelerator calls it)."""
        self.sync_gradients = sync_gradients

    # -- data loaders being iterated -----------------------------------------

    @property
    def dataloader_references(self) -> list[Any]:
        """The loaders being iterated, outermost first (None for the initial entry and for dropped loaders)."""
        return [reference() if reference is not None else None for reference in self._dataloader_references_ref]

    @dataloader_references.setter
    def dataloader_references(self, loaders: list[Any]) -> None:
        self._dataloader_references_ref = [weakref.ref(loader) if loader is not None else None for loader in loaders]

    @property
    def active_dataloader(self) -> Any:
        """The innermost loader being iterated (the last reference), or None."""
        return self.dataloader_references[-1]

    @property
    def in_dataloader(self) -> bool:
        """Whether some prepared loader is being iterated."""
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        """The active loader's ``end_of_dataloader`` (True on its last batch); False outside any loader."""
        if not self.in_dataloader:
            return False
        return self.active_dataloader.end_of_dataloader

    @property
    def remainder(self) -> int:
        """Real samples in the active loader's last global batch; -1 when unknown or outside any loader."""
        if not self.in_dataloader:
            return -1
        return self.active_dataloader.remainder

    def _add_dataloader(self, dataloader: Any) -> None:
        """Register ``dataloader`` as the active loader (a loader calls it when an epoch starts)."""
        self.dataloader_references = self.dataloader_references + [dataloader]

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Unregister ``dataloader`` (a loader calls it when its epoch ends)."""
        self.dataloader_references = [loader for loader in self.dataloader_references if loader is not dataloader]

    @staticmethod
    def _reset_state() -> None:
        GradientState._shared_state.clear()
