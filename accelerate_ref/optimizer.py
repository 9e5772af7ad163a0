"""The prepared optimizer: steps only when gradients are synchronised, through the scaler under fp16.

Catalog: accumulate.doc_example, accumulate.plugin, autocast.fp16_scaler,
prepare.order, prepare.single_methods.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch

from .state import AcceleratorState, GradientState
from .utils._operations.structures import honor_type


def move_to_device(state: Any, device: Any) -> Any:
    """``state`` (an optimizer state dict, or any nest of lists, tuples and dicts) with every tensor on ``device``.

    Rule (HF 1.15): containers keep their type (named tuples included);
    anything not a tensor is returned as it is.
    """
    if isinstance(state, (list, tuple)):
        return honor_type(state, (move_to_device(item, device) for item in state))
    if isinstance(state, dict):
        return type(state)({key: move_to_device(value, device) for key, value in state.items()})
    return state.to(device) if isinstance(state, torch.Tensor) else state


def patch_optimizer_step(accelerated_optimizer: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (an optimizer's ``step``) that first records the call on ``accelerated_optimizer``.

    Rule (HF 1.15): calling the result sets
    ``accelerated_optimizer._accelerate_step_called = True`` and returns what
    ``method`` returns; a gradient scaler that skips the step never calls it.
    """

    def patched_step(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched_step


#: What the fp16 step keeps on the wrapper for itself, left out of its pickled state.
_STEP_BOOKKEEPING = ("_accelerate_step_called", "_unscaled_step")


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps the user's optimizer; `Accelerator.prepare` returns it in its place.

    Rules:

    * ``step()`` and ``zero_grad()`` act only when ``GradientState`` says
      gradients are synchronised on this step; while accumulating they do
      nothing, so the weights change once per accumulation cycle
      (catalog ``accumulate.doc_example``, ``accumulate.plugin``).
    * With a ``scaler`` (fp16), ``step()`` goes through ``scaler.step`` and
      ``scaler.update``; a step the scaler skips because gradients overflowed
      sets `step_was_skipped` (HF's ``_is_overflow``, which a script may set
      itself; catalog ``autocast.fp16_scaler``).
    * With ``device_placement``, the optimizer's state is moved to the
      state's device.

    ``state``, ``param_groups`` and ``defaults`` are the wrapped optimizer's.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Optional[torch.amp.GradScaler] = None,
    ) -> None:
        # torch.optim.Optimizer.__init__ is not called: every attribute it would set is the wrapped one's.
        self.optimizer = optimizer
        self.scaler = scaler
        self.device_placement = device_placement
        self.accelerator_state = AcceleratorState()
        self.gradient_state = GradientState()
        self._is_overflow = False
        if scaler is not None:
            # The step the scaler calls, fixed here as HF 1.15 fixes it: an optimizer without one is refused
            # now, and a step assigned to the optimizer later gives way to this one after each scaled step.
            self._unscaled_step = optimizer.step
        if device_placement:
            placed = move_to_device(self.optimizer.state_dict(), self.accelerator_state.device)
            self.optimizer.load_state_dict(placed)

    # -- the wrapped optimizer's attributes ---------------------------------

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state. Catalog: prepare.order."""
        return self.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.optimizer.state = state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (the model's parameters). Catalog: prepare.order."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, param_groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's default hyper-parameters. Catalog: prepare.order."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.optimizer.defaults = defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer. Catalog: prepare.order."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict. Catalog: save_state.roundtrip."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict into the wrapped optimizer. Catalog: save_state.roundtrip."""
        self.optimizer.load_state_dict(state_dict)

    def train(self) -> None:
        """Put an optimizer that has modes (schedule-free ones) in training mode; others have none.

        Rule (HF 1.15): the wrapped optimizer's ``train`` if it is callable,
        else that of the optimizer it wraps in turn (DeepSpeed's wrapper).
        """
        self._switch_mode("train")

    def eval(self) -> None:
        """Put an optimizer that has modes (schedule-free ones) in evaluation mode; the rule of `train`."""
        self._switch_mode("eval")

    def _switch_mode(self, mode: str) -> None:
        for candidate in (self.optimizer, getattr(self.optimizer, "optimizer", None)):
            switch = getattr(candidate, mode, None)
            if callable(switch):
                switch()
                return

    # -- the rules ------------------------------------------------------------

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Clear gradients, but only on a step where gradients are synchronised.

        Rules (HF 1.15): an optimizer whose ``zero_grad`` takes
        ``set_to_none`` is given it (True when not given); one whose
        ``zero_grad`` does not is called bare, and refuses an explicit
        ``set_to_none`` with a ValueError. Catalog: accumulate.doc_example.
        """
        if not self.gradient_state.sync_gradients:
            return
        if "set_to_none" in inspect.signature(self.optimizer.zero_grad).parameters:
            self.optimizer.zero_grad(set_to_none=True if set_to_none is None else set_to_none)
        elif set_to_none is not None:
            raise ValueError("`set_to_none` for Optimizer.zero_grad` is not supported by this optimizer.")
        else:
            self.optimizer.zero_grad()

    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:
        """Update the weights, but only on a step where gradients are synchronised.

        Under fp16 the scaler unscales, skips the update if any gradient is
        inf/NaN, and adjusts its scale; whether it called the optimizer's
        ``step`` (`patch_optimizer_step`, as HF detects it) is recorded in
        `step_was_skipped`. Returns None, even with a ``closure`` (HF 1.15
        drops the loss the wrapped ``step`` returns).
        Catalog: accumulate.doc_example, autocast.fp16_scaler.
        """
        if not self.gradient_state.sync_gradients:
            return
        if self.scaler is None:
            self.optimizer.step(closure)
            return
        self._accelerate_step_called = False
        self.optimizer.step = patch_optimizer_step(self, self._unscaled_step)
        try:
            self.scaler.step(self.optimizer, closure)  # positional: GradScaler refuses closure=...
            self.scaler.update()
        finally:
            self.optimizer.step = self._unscaled_step
        self._is_overflow = not self._accelerate_step_called
        self._accelerate_step_called = False

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last synchronised step was skipped because gradients overflowed (fp16).

        Catalog: autocast.fp16_scaler.
        """
        return self._is_overflow

    # torch's Optimizer pickles only defaults, state and param_groups, which here are the wrapped
    # optimizer's: pickle the wrapper's own attributes instead (the wrapped optimizer among them).
    def __getstate__(self) -> dict[str, Any]:
        """The wrapper's attributes but the step-tracking flag, so a prepared optimizer pickles (as HF's does)."""
        return {key: value for key, value in self.__dict__.items() if key not in _STEP_BOOKKEEPING}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore `__getstate__`'s attributes; with a scaler, the step it calls is the restored optimizer's.

        Rule (HF 1.15): a state without ``scaler`` is refused (AttributeError).
        """
        self.__dict__.update(state)
        if self.scaler is not None:
            self._accelerate_step_called = False
            self._unscaled_step = self.optimizer.step
