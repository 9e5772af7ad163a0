"""Broken: a sharded loader never moves its batches to the device.

Rule: batches of a prepared loader land on ``accelerator.device`` (unless
``device_placement=False``). Caught at world 2 by ``data.device_placement``,
whose batches carry an object that records where it was sent.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("data_loader.DataLoaderShard.__init__")


def __init__(self, dataset, device=None, **kwargs):
    original(self, dataset, device=None, **kwargs)


ref.replace("data_loader.DataLoaderShard.__init__", __init__)
ref.export(globals())
