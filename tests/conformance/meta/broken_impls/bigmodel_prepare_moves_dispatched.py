"""Broken: ``prepare`` moves a model dispatched with a device map onto the Accelerator's device.

Rule (prepare.verify_device_map): at one process a dispatched model stays
where its device map put it. On ``sim-npu`` (four mock NPUs) every block
lands on npu:0; on ``sim`` the disk-offloaded weights (on ``meta``) cannot
be moved at all.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
accelerator_class = ref.get("accelerator.Accelerator")
original = accelerator_class.prepare_model


def prepare_model(self, model, device_placement=None, evaluation_mode=False):
    if not self.use_distributed:
        torch.nn.Module.to(model, self.device)  # the device map forgotten (past dispatch_model's guard on `to`)
    return original(self, model, device_placement, evaluation_mode)


accelerator_class.prepare_model = prepare_model
ref.export(globals())
