"""LOMO optimizers (the `lomo-optim` package): backward and update fused into one pass.

`Lomo` and `AdaLomo` register a hook on every trainable parameter that updates
it as soon as its gradient is computed, so no gradient outlives its parameter's
update. They have no ``step()``: the update happens in their
``fused_backward(loss, lr)``. `Accelerator.backward(loss, learning_rate=lr)`
and `Accelerator.lomo_backward(loss, lr)` route there, as HF 1.15's do.

Catalog: backward.loss (the LOMO route of `Accelerator.backward`).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ..utils.imports import is_lomo_available


def _lomo_classes() -> tuple[type, ...]:
    """`lomo_optim`'s optimizer classes, or none where the package is not installed."""
    if not is_lomo_available():
        return ()
    from lomo_optim import AdaLomo, Lomo

    return (Lomo, AdaLomo)


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
