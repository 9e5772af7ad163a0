"""Broken: `prepare(..., device_placement=[...])` ignores the per-object flags.

Rule: ``device_placement=[True, True, False, False]`` places only the first
two objects. Caught at world 2 by ``prepare.device_placement_list``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("accelerator.Accelerator.prepare")


def prepare(self, *args, device_placement=None):
    return original(self, *args)


ref.replace("accelerator.Accelerator.prepare", prepare)
ref.export(globals())
