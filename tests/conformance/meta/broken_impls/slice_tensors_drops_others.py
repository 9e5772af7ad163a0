"""Broken: `slice_tensors` drops the non-tensor leaves of a dict.

Rule: the slice applies to every tensor; other leaves are kept. Caught at
world 1 by ``ops.slice_tensors``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils._operations.structures.slice_tensors")


def slice_tensors(data, tensor_slice, process_index=None, num_processes=None):
    sliced = original(data, tensor_slice, process_index, num_processes)
    if isinstance(sliced, dict):
        return {key: value for key, value in sliced.items() if isinstance(value, (torch.Tensor, list, tuple, dict))}
    return sliced


ref.replace("utils._operations.structures.slice_tensors", slice_tensors)
ref.export(globals())
