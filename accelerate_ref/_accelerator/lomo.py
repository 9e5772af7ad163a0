"""LOMO optimizers (the `lomo-optim` package): backward and update fused into one pass.

`Lomo` and `AdaLomo` register a hook on every trainable parameter that updates
it as soon as its gradient is computed, so no gradient outlives its parameter's
update. They have no ``step()``: the update happens in their
``fused_backward(loss, lr)``. `Accelerator.backward(loss, learning_rate=lr)`
and `Accelerator.lomo_backward(loss, lr)` route there, as HF 1.15's do.

Catalog: backward.loss (the LOMO route of `Accelerator.backward`).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

import torch


def _lomo_classes() -> tuple[type, ...]:
    """`lomo_optim`'s optimizer classes, or none before `lomo_optim` is imported: an optimizer can be a Lomo or
    AdaLomo (or a subclass of one) only once the module that defines them is, so the check never imports the
    package itself (which imports Transformers: about 1.5 s in a process that prepares an optimizer, measured on a
    2-core VM on 2026-11-30)."""
    module = sys.modules.get("lomo_optim")
    return () if module is None else (module.Lomo, module.AdaLomo)


def is_lomo_optimizer(optimizer: Any) -> bool:
    """True when ``optimizer`` (or the optimizer a prepared one wraps) is a `lomo_optim` Lomo or AdaLomo."""
    return isinstance(getattr(optimizer, "optimizer", optimizer), _lomo_classes())


def lomo_backward(optimizers: Iterable[Any], loss: torch.Tensor, learning_rate: float) -> None:
    """Run ``loss``'s backward through every prepared LOMO optimizer's ``fused_backward(loss, learning_rate)``.

    Rules (HF 1.15's ``Accelerator.lomo_backward``): ``learning_rate`` None
    is a ValueError; so is a call where none of the prepared optimizers is a
    Lomo or AdaLomo (also where `lomo-optim` is not installed). Each LOMO
    optimizer updates its model's parameters during the backward, with
    ``learning_rate``. Catalog: backward.loss.
    """
    if learning_rate is None:
        raise ValueError("A learning rate must be passed in order to call backward pass with LOMO optimizers.")
    lomo_optimizers = [getattr(o, "optimizer", o) for o in optimizers if is_lomo_optimizer(o)]
    if not lomo_optimizers:
        raise ValueError(
            "Backward pass not properly called on LOMO optimizers. "
            "Are you sure you passed a LOMO optimizer in accelerator.prepare()?"
        )
    for optimizer in lomo_optimizers:
        optimizer.fused_backward(loss, learning_rate)
