"""Broken: `pad_across_processes` ignores `pad_index` (always pads with zeros).

Rule: the padding value is ``pad_index``. Caught at world 2 by
``pad.pad_first_index_dim``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.pad_across_processes")


def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
    return original(tensor, dim=dim, pad_index=0, pad_first=pad_first)


ref.replace("utils.operations.pad_across_processes", pad_across_processes)
ref.export(globals())
