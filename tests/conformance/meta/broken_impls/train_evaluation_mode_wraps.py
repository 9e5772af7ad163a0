"""Broken: `prepare_model(model, evaluation_mode=True)` wraps the model in DDP anyway.

Rule: evaluation mode applies mixed precision only, no distributed wrapper.
Caught at world 2 by ``prepare.evaluation_mode``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("accelerator.Accelerator.prepare_model")


def prepare_model(self, model, device_placement=None, evaluation_mode=False):
    return original(self, model, device_placement=device_placement, evaluation_mode=False)


ref.replace("accelerator.Accelerator.prepare_model", prepare_model)
ref.export(globals())
