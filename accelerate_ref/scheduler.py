"""The prepared learning-rate scheduler: steps in step with the optimizer's real updates.

Importing this module silences torch's UserWarnings from ``torch.optim.lr_scheduler`` process-wide,
as importing HF 1.15's does: the wrapper steps schedulers on the script's behalf (several times per
update, or not at all after a skipped step), which trips torch's step-order warning for no fault of
the script's.

Catalog: accumulate.scheduler, prepare.order, prepare.single_methods.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence, Union

import torch

from .optimizer import AcceleratedOptimizer
from .state import AcceleratorState, GradientState

warnings.filterwarnings("ignore", category=UserWarning, module="torch.optim.lr_scheduler")


class AcceleratedScheduler:
    """Wraps the user's scheduler; `Accelerator.prepare` returns it in its place.

    Rules of ``step()`` (HF 1.15's, measured side by side in
    tests/test_switching_behaviour.py; catalog ``accumulate.scheduler``):

    * ``step_with_optimizer=False`` (``Accelerator(step_scheduler_with_optimizer=False)``):
      every call steps the scheduler once; the script decides when.
    * Otherwise the scheduler follows the optimizer's real updates. On a
      micro-batch that only accumulates gradients it does not step; when
      ``GradientState.adjust_scheduler`` is True only its ``_step_count``
      goes up by one (what OneCycleLR's limit below counts). HF 1.15 reads
      that flag from the plugin's non-default settings only, so the
      plugin's default True reads False: by default nothing happens.
      When an optimizer skipped its update (fp16 overflow:
      `AcceleratedOptimizer.step_was_skipped`) it does not step.
    * On a real update it steps once with ``split_batches``, else once per
      process: each process consumed a batch of the script's size, so one
      update saw ``num_processes`` of the script's batches, and a scheduler
      written for one process stays on schedule. In those per-process
      steps a scheduler with ``total_steps`` (OneCycleLR) is not stepped
      once its ``_step_count`` is past ``total_steps``; it is not guarded
      otherwise (a single step past the total is torch's ValueError).
    """

    def __init__(
        self,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        optimizers: Union[AcceleratedOptimizer, Sequence[AcceleratedOptimizer]],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        # A list or tuple is kept as given (HF 1.15): the Accelerator's own list of prepared optimizers,
        # given for a scheduler whose optimizer is not prepared, goes on growing with later ones.
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler as the class rules say. Catalog: accumulate.scheduler."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(optimizer.step_was_skipped for optimizer in self.optimizers):
            return
        if self.split_batches:
            self.scheduler.step(*args, **kwargs)
            return
        for _ in range(AcceleratorState().num_processes):
            if not self._past_total_steps():
                self.scheduler.step(*args, **kwargs)

    def _past_total_steps(self) -> bool:
        """Whether a scheduler with ``total_steps`` (OneCycleLR) has counted past it."""
        return hasattr(self.scheduler, "total_steps") and self.scheduler._step_count > self.scheduler.total_steps

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

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped scheduler's ``print_lr`` (torch 2.13's schedulers have none: AttributeError)."""
        return self.scheduler.print_lr(*args, **kwargs)
