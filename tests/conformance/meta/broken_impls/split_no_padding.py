"""Broken: `split_between_processes` ignores `apply_padding`.

Rule: with ``apply_padding=True`` every share is as long as the longest,
filled with the input's last item (``["C", "C"]`` on rank 1 of 2). Caught at
world 2 by ``split.padding``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state._split")


def _split(inputs, num_processes, index, apply_padding, device):
    return original(inputs, num_processes, index, False, device)


ref.replace("state._split", _split)
ref.export(globals())
