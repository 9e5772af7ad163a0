"""Broken: `DistributedDataParallelKwargs` never reach the DDP wrapper.

Rule: ``DistributedDataParallelKwargs(find_unused_parameters=True)`` reaches
``DistributedDataParallel``. Caught at world 2 by ``kwargs.ddp``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("accelerator.Accelerator.prepare_model")


def prepare_model(self, model, device_placement=None, evaluation_mode=False):
    handler, self.ddp_handler = self.ddp_handler, None
    try:
        return original(self, model, device_placement=device_placement, evaluation_mode=evaluation_mode)
    finally:
        self.ddp_handler = handler


ref.replace("accelerator.Accelerator.prepare_model", prepare_model)
ref.export(globals())
