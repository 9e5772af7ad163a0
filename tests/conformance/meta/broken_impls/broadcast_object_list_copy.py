"""Broken: `broadcast_object_list` returns a new list and leaves the caller's list as it was.

Rule: the list is modified in place with rank ``from_process``'s objects.
Caught at world 2 by ``broadcast_object_list.in_place``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.broadcast_object_list")


def broadcast_object_list(object_list, from_process=0):
    return original(list(object_list), from_process=from_process)


ref.replace("utils.operations.broadcast_object_list", broadcast_object_list)
ref.export(globals())
