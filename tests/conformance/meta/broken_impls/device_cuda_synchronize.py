"""Broken: `wait_for_everyone` calls a CUDA-only API on every accelerator.

Rule: ``wait_for_everyone()`` is a barrier on whatever device the processes
run (catalog ``sync.wait_for_everyone``). This one first calls
``torch.cuda.synchronize()`` whenever the device is not the CPU, as code
written for GPUs only does: unnoticed in CPU worlds, it fails on ``sim-xla``
("Torch not compiled with CUDA enabled"), and ``sync.wait_for_everyone``
reports it.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state.PartialState.wait_for_everyone")


def wait_for_everyone(self):
    if self.device.type != "cpu":
        torch.cuda.synchronize()
    original(self)


ref.replace("state.PartialState.wait_for_everyone", wait_for_everyone)
ref.export(globals())
