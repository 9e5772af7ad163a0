"""Broken: `apply_padding` fills a short share with the share's own last item, not the input's.

Rule: padding repeats the last item of the whole input. The documented
example (world 2) cannot tell them apart (rank 1's share is ``["C"]``);
caught at world 4 (9 items: rank 1 holds ``[x3, x4]`` and must get ``x8``) by
``split.padding``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state._split")


def _split(inputs, num_processes, index, apply_padding, device):
    if isinstance(inputs, dict) or not apply_padding:
        return original(inputs, num_processes, index, apply_padding, device)
    share = original(inputs, num_processes, index, False, device)
    longest = -(-len(inputs) // num_processes)
    missing = longest - len(share)
    if missing == 0 or len(share) == 0:
        return original(inputs, num_processes, index, True, device)
    if isinstance(inputs, torch.Tensor):
        return torch.cat([share, share[-1:].expand(missing, *share.shape[1:])])
    return share + type(share)([share[-1]] * missing)


ref.replace("state._split", _split)
ref.export(globals())
