"""The `Accelerator`: one object a training script talks to.

This module holds the constructor, the topology attributes, process control
and the collective methods. Each method states the documented rule it
implements and the catalog ID that checks it.
"""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

import torch

from .state import AcceleratorState, GradientState, PartialState
from .utils import operations
from .utils.dataclasses import (
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
)

F = TypeVar("F", bound=Callable[..., Any])

#: Constructor arguments whose engines this reference does not provide yet.
_UNSUPPORTED_ENGINES = ("deepspeed_plugin", "fsdp_plugin", "megatron_lm_plugin", "torch_tp_plugin", "deepspeed_plugins")


class Accelerator:
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
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: Any = None,
        **engines: Any,
    ) -> None:
        unknown = sorted(set(engines) - set(_UNSUPPORTED_ENGINES))
        if unknown:
            raise TypeError(f"Accelerator() got unexpected keyword argument(s): {', '.join(unknown)}")
        requested = sorted(name for name, value in engines.items() if value is not None)
        if requested:
            raise NotImplementedError(f"accelerate_ref does not provide {', '.join(requested)} yet")
        if gradient_accumulation_plugin is not None and gradient_accumulation_steps != 1:
            raise ValueError(
                "Pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both "
                "(catalog accumulate.plugin)"
            )
        handlers = _index_handlers(kwargs_handlers or [])
        init_kwargs = handlers.get(InitProcessGroupKwargs)
        self.state = AcceleratorState(
            mixed_precision=mixed_precision,
            cpu=cpu,
            dynamo_plugin=dynamo_plugin,
            _from_accelerator=True,
            **(init_kwargs.to_kwargs() if init_kwargs else {}),
        )
        if gradient_accumulation_plugin is None:
            steps = int(os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", gradient_accumulation_steps))
            gradient_accumulation_plugin = GradientAccumulationPlugin(num_steps=steps)
        self.gradient_state = GradientState(gradient_accumulation_plugin)
        self.device_placement = device_placement
        self.dataloader_config = dataloader_config or DataLoaderConfiguration(split_batches=split_batches)
        self.project_configuration = project_config or ProjectConfiguration(project_dir=project_dir)
        self.rng_types = rng_types
        self.log_with = log_with
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.dynamo_backend = dynamo_backend
        self.kwargs_handlers = handlers
        self.flag_tensor: torch.Tensor | None = None

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

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    # -- process control: the state's rules, reached from the Accelerator --

    @property
    def _partial(self) -> PartialState:
        return PartialState()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print once per machine. Catalog: ``print.once_per_server``."""
        self._partial.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Barrier across all ranks. Catalog: ``sync.wait_for_everyone``."""
        self._partial.wait_for_everyone()

    def main_process_first(self):
        """Catalog: ``sync.main_process_first``."""
        return self._partial.main_process_first()

    def local_main_process_first(self):
        """Catalog: ``sync.local_main_process_first``."""
        return self._partial.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False):
        """Catalog: ``split.*``. See `PartialState.split_between_processes`."""
        return self._partial.split_between_processes(inputs, apply_padding=apply_padding)

    def on_main_process(self, function: F | None = None) -> F:
        """Catalog: ``process.on_main_process``."""
        return self._partial.on_main_process(function)

    def on_local_main_process(self, function: F | None = None) -> F:
        """Catalog: ``process.on_local_main_process``."""
        return self._partial.on_local_main_process(function)

    def on_last_process(self, function: F | None = None) -> F:
        """Catalog: ``process.on_last_process``."""
        return self._partial.on_last_process(function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> F:
        """Catalog: ``process.on_process``."""
        return self._partial.on_process(function, process_index=process_index)

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> F:
        """Catalog: ``process.on_local_process``."""
        return self._partial.on_local_process(function, local_process_index=local_process_index)

    # -- triggers ----------------------------------------------------------

    def set_trigger(self) -> None:
        """Raise this rank's flag; the next `check_trigger` on every rank sees it.

        Catalog: ``trigger.set_check`` (erratum: the example calls it ``check_breakpoint``).
        """
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every rank if any rank set the trigger since the last check; then lowered.

        A collective: every rank must call it.
        """
        flag = self.flag_tensor if self.flag_tensor is not None else torch.tensor(0, device=self.device)
        raised = bool(self.reduce(flag, reduction="sum").item() >= 1)
        self.flag_tensor = torch.tensor(0, device=self.device) if raised else flag
        return raised

    # -- collectives -------------------------------------------------------

    def gather(self, tensor: Any) -> Any:
        """Catalog: ``gather.*``. See `accelerate_ref.utils.gather`."""
        return operations.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce across ranks; the Accelerator defaults to ``"sum"`` (the utility to ``"mean"``).

        Catalog: ``reduce.doc_example``, ``reduce.mean``, ``reduce.none``.
        """
        return operations.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Catalog: ``pad.*``. See `accelerate_ref.utils.pad_across_processes`."""
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)


def _index_handlers(handlers: list[KwargsHandler]) -> dict[type, KwargsHandler]:
    """Map each handler's class to the handler; the same class twice is an error."""
    indexed: dict[type, KwargsHandler] = {}
    for handler in handlers:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(f"kwargs_handlers takes KwargsHandler instances, got {type(handler).__name__}")
        if type(handler) in indexed:
            raise ValueError(f"kwargs_handlers got more than one {type(handler).__name__}")
        indexed[type(handler)] = handler
    return indexed
