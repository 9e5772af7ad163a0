"""Broken: prepared loaders put their batches on the CPU, whatever the accelerator's device.

Rule: batches of a prepared loader land on ``accelerator.device`` (catalog
``data.device_placement``). Invisible in CPU worlds, where the two devices
are one; on ``sim-xla`` the batches stay on the CPU while the model is on
``xla:<rank>``, and ``data.device_placement`` reports the device the
batch's tensor landed on.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.DataLoaderShard.__init__")


def __init__(self, dataset, device=None, **kwargs):
    original(self, dataset, device=None if device is None else torch.device("cpu"), **kwargs)


ref.replace("data_loader.DataLoaderShard.__init__", __init__)
ref.export(globals())
