"""Broken: `gather` of a 0-d tensor returns the rank's own 0-d tensor (not gathered, not 1-d).

Rule: a 0-d tensor gathers to a 1-d tensor of length ``num_processes``.
Caught at world 2 by ``gather.scalar``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.gather")


def gather(tensor):
    if isinstance(tensor, torch.Tensor) and tensor.ndim == 0:
        return tensor.clone()
    return original(tensor)


ref.replace("utils.operations.gather", gather)
ref.export(globals())
