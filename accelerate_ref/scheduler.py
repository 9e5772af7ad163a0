"""The prepared learning-rate scheduler: steps in step with the optimizer's real updates.

Catalog: accumulate.scheduler, prepare.order, prepare.single_methods.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import torch

from .optimizer import AcceleratedOptimizer
from .state import AcceleratorState, GradientState


class AcceleratedScheduler:
    """Wraps the user's scheduler; `Accelerator.prepare` returns it in its place.

    Rules of ``step()`` (catalog ``accumulate.scheduler``):

    * ``step_with_optimizer=False`` (``Accelerator(step_scheduler_with_optimizer=False)``):
      every call steps the scheduler; the script decides when.
    * Otherwise the scheduler follows the optimizer's real updates: on a
      micro-batch that only accumulates gradients it does not step (unless
      the `GradientAccumulationPlugin` says ``adjust_scheduler=False``: then
      the scheduler was not to be adjusted for accumulation and steps on
      every call), and it does not step when fp16 overflow made an optimizer
      skip its update.
    * On a real update it steps once per process unless ``split_batches``:
      each process consumed a batch of the script's size, so one update saw
      ``num_processes`` of the script's batches, and a scheduler written for
      one process stays on schedule. A scheduler with ``total_steps``
      (OneCycleLR) never steps past it.
    """

    def __init__(
        self,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        optimizers: Union[AcceleratedOptimizer, Sequence[AcceleratedOptimizer]],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler as the class rules say. Catalog: accumulate.scheduler."""
        for _ in range(self._steps_now()):
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler._step_count > total:
                return
            self.scheduler.step(*args, **kwargs)

    def _steps_now(self) -> int:
        """How many times the wrapped scheduler steps for this call."""
        if not self.step_with_optimizer:
            return 1
        if not self.gradient_state.sync_gradients:
            return 0 if self.gradient_state.adjust_scheduler else 1
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return 0
        return 1 if self.split_batches else AcceleratorState().num_processes

    # -- the wrapped scheduler's methods ------------------------------------

    def get_last_lr(self) -> list[float]:
        """The learning rates the wrapped scheduler last set. Catalog: accumulate.scheduler."""
        return self.scheduler.get_last_lr()

    def get_lr(self) -> list[float]:
        """The wrapped scheduler's ``get_lr()`` (its formula at the current step). Catalog: accumulate.scheduler."""
        return self.scheduler.get_lr()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state dict. Catalog: save_state.roundtrip."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict into the wrapped scheduler. Catalog: save_state.roundtrip."""
        self.scheduler.load_state_dict(state_dict)

    def print_lr(self, *args: Any, **kwargs: Any) -> None:
        """The wrapped scheduler's ``print_lr``. Catalog: accumulate.scheduler."""
        self.scheduler.print_lr(*args, **kwargs)
