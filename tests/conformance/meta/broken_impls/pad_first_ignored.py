"""Broken: `pad_across_processes` ignores `pad_first` (always pads at the end).

Rule: ``pad_first=True`` puts the padding before the data. Caught at world 2
by ``pad.pad_first_index_dim``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.pad_across_processes")


def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
    return original(tensor, dim=dim, pad_index=pad_index, pad_first=False)


ref.replace("utils.operations.pad_across_processes", pad_across_processes)
ref.export(globals())
