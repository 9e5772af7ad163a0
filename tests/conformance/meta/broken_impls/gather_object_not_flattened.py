"""Broken: `gather_object` of a list returns one list per rank instead of their concatenation.

Rule: ``gather_object([r])`` on 2 ranks gives ``[0, 1]``. Caught at world 2
by ``gather_object.nested``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.gather_object")


def gather_object(object):
    if isinstance(object, (list, tuple)):
        return original(("whole", object))[1::2]  # every rank's list as one item
    return original(object)


ref.replace("utils.operations.gather_object", gather_object)
ref.export(globals())
