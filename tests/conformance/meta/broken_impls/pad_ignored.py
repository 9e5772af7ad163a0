"""Broken: `pad_across_processes` returns its input unchanged.

Rule: every tensor is padded to the largest size any process has on ``dim``.
Caught at world 2 by ``pad.doc_example`` and ``pad.pad_first_index_dim``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def pad_across_processes(tensor, dim=0, pad_index=0, pad_first=False):
    return tensor


ref.replace("utils.operations.pad_across_processes", pad_across_processes)
ref.export(globals())
