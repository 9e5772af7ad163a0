"""Broken: `AutocastKwargs` are ignored; autocast always runs enabled.

Rule: ``AutocastKwargs(enabled=False)`` (given to the Accelerator or to
``autocast()``) reverts a block to fp32. Caught at world 2 by ``autocast.bf16``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("_accelerator.precision.MixedPrecision.autocast")


def autocast(self, autocast_handler=None):
    if not self.native_amp:
        return original(self, autocast_handler)
    return torch.autocast(device_type=self.device.type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[self.mixed_precision])


ref.replace("_accelerator.precision.MixedPrecision.autocast", autocast)
ref.export(globals())
