"""Broken: `split_between_processes` gives the extra items to the last ranks instead of the first.

Rule: shares differ by at most one item and the earlier ranks take the
extras (``["A", "B", "C"]`` on 2 ranks: ``["A", "B"]`` and ``["C"]``). Caught
at world 2 by ``split.doc_example``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state._split")


def _split(inputs, num_processes, index, apply_padding, device):
    if isinstance(inputs, dict):
        return original(inputs, num_processes, index, apply_padding, device)  # its values come back here
    per, extras = divmod(len(inputs), num_processes)
    first_with_extra = num_processes - extras
    start = index * per + max(0, index - first_with_extra)
    end = start + per + (1 if index >= first_with_extra else 0)
    share = inputs[start:end]
    missing = per + (1 if extras else 0) - (end - start)
    if not apply_padding or missing == 0 or len(inputs) == 0:
        return share
    if isinstance(inputs, torch.Tensor):
        return torch.cat([share, inputs[-1:].expand(missing, *inputs.shape[1:])])
    return share + type(share)([inputs[-1]] * missing)


ref.replace("state._split", _split)
ref.export(globals())
