"""Broken: `broadcast` ignores `from_process` and always sends rank 0's tensors.

Rule: ``broadcast(tensor, from_process=k)`` gives rank k's tensor everywhere.
Caught at world 2 by ``broadcast.from_process``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.broadcast")


def broadcast(tensor, from_process=0):
    return original(tensor, from_process=0)


ref.replace("utils.operations.broadcast", broadcast)
ref.export(globals())
