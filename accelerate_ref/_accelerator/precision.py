"""Mixed precision: the autocast context, the gradient scaler and the prepared model's forward.

One `MixedPrecision` per `Accelerator`, built from ``mixed_precision``, the
device and the `AutocastKwargs` / `GradScalerKwargs` handlers:

* ``"no"``: nothing changes.
* ``"bf16"``: forwards run under ``torch.autocast(device, torch.bfloat16)``.
* ``"fp16"``: forwards run under ``torch.autocast(device, torch.float16)``
  and a ``torch.amp.GradScaler`` for the device scales the loss, unscales
  gradients and skips updates whose gradients overflowed. This holds on CPU
  too (torch has a CPU GradScaler), so fp16 behaves the same on a laptop as
  on a GPU.
* ``"fp8"``: needs an FP8 engine (without one the state refuses it, in
  HF 1.15's words); with one, NotImplementedError (the reference does not
  drive FP8 engines).

Catalog: autocast.bf16, autocast.fp16_scaler, clip.grad_norm, unscale.noop,
prepare.evaluation_mode, unwrap.keep_fp32_wrapper, plugin.unavailable_engines.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, ContextManager, Iterable, Optional

import torch

from ..optimizer import AcceleratedOptimizer
from ..utils.dataclasses import AutocastKwargs, GradScalerKwargs
from ..utils.other import ORIGINAL_FORWARD
from ..utils._operations.structures import convert_outputs_to_fp32

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecision:
    """What ``mixed_precision`` means for one `Accelerator` on one device."""

    def __init__(
        self,
        mixed_precision: str,
        device: torch.device,
        autocast_handler: Optional[AutocastKwargs] = None,
        scaler_handler: Optional[GradScalerKwargs] = None,
    ) -> None:
        if mixed_precision == "fp8":
            _refuse_fp8()
        self.mixed_precision = mixed_precision
        self.device = device
        self.autocast_handler = autocast_handler
        #: Whether forwards run under torch.autocast (the name HF accelerate uses).
        self.native_amp = mixed_precision in _AUTOCAST_DTYPES
        self.scaler: Optional[torch.amp.GradScaler] = None
        if mixed_precision == "fp16":
            kwargs = scaler_handler.to_kwargs() if scaler_handler is not None else {}
            self.scaler = torch.amp.GradScaler(device.type, **kwargs)

    def autocast(self, autocast_handler: Optional[AutocastKwargs] = None) -> ContextManager[Any]:
        """The context in which computations run in the configured precision.

        Rule: ``torch.autocast`` on the device with the precision's dtype and
        the handler's arguments (the given one, else the Accelerator's);
        ``AutocastKwargs(enabled=False)`` reverts a block to fp32. A no-op
        context without mixed precision. Catalog: autocast.bf16.
        """
        if not self.native_amp:
            return contextlib.nullcontext()
        handler = autocast_handler if autocast_handler is not None else self.autocast_handler
        kwargs = handler.to_kwargs() if handler is not None else {}
        return torch.autocast(device_type=self.device.type, dtype=_AUTOCAST_DTYPES[self.mixed_precision], **kwargs)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Make ``model.forward`` run under `autocast` and return fp32 outputs.

        Rule: activations inside the model are in the autocast dtype where
        torch autocasts; the outputs are converted back to fp32 so that the
        loss is computed in full precision. The user's forward is kept as
        ``model._original_forward`` for ``unwrap_model(...,
        keep_fp32_wrapper=False)``. Catalog: autocast.bf16, unwrap.keep_fp32_wrapper.
        """
        if not self.native_amp or ORIGINAL_FORWARD in model.__dict__:
            return
        original = model.forward

        @functools.wraps(original)
        def forward_in_mixed_precision(*args: Any, **kwargs: Any) -> Any:
            with self.autocast():
                return original(*args, **kwargs)

        setattr(model, ORIGINAL_FORWARD, original)
        model.forward = convert_outputs_to_fp32(forward_in_mixed_precision)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward`` on: multiplied by the scaler's scale under fp16.

        Catalog: autocast.fp16_scaler.
        """
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Divide the gradients of ``optimizers`` by the scale (fp16); a no-op otherwise.

        Catalog: unscale.noop, clip.grad_norm.
        """
        if self.scaler is None:
            return
        for optimizer in optimizers:
            self.scaler.unscale_(optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer)


def _refuse_fp8() -> None:
    """An FP8 engine is installed (`state.AcceleratorState` refuses fp8 without one), but not driven here."""
    raise NotImplementedError("accelerate_ref does not drive FP8 engines; use mixed_precision='bf16' or 'fp16'")
