"""Broken: ``mixed_precision="fp16"`` autocasts but uses no gradient scaler (HF accelerate's behaviour on CPU).

Rule: under fp16 a GradScaler configured by ``GradScalerKwargs`` scales the
loss and skips overflowing steps (``optimizer_step_was_skipped``). Caught at
world 2 by ``autocast.fp16_scaler``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("_accelerator.precision.MixedPrecision.__init__")


def __init__(self, mixed_precision, device, autocast_handler=None, scaler_handler=None):
    original(self, mixed_precision, device, autocast_handler, scaler_handler)
    self.scaler = None


ref.replace("_accelerator.precision.MixedPrecision.__init__", __init__)
ref.export(globals())
