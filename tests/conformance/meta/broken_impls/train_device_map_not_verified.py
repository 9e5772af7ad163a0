"""Broken: `verify_device_map` always answers False.

Rule: a model dispatched over several devices with a device map is
recognised, and several processes refuse to train it. Caught at world 2 by
``prepare.verify_device_map``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def verify_device_map(self, model):
    return False


ref.replace("accelerator.Accelerator.verify_device_map", verify_device_map)
ref.export(globals())
