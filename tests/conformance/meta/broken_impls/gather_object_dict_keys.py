"""Broken: `gather_object` of a dict gathers its keys (HF accelerate 1.15, accelerate issue #2188).

Rule: a dict on each rank gives the list of every rank's dict. Caught at
world 2 by ``gather_object.structures``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.gather_object")


def gather_object(object):
    return original(list(object) if isinstance(object, dict) else object)


ref.replace("utils.operations.gather_object", gather_object)
ref.export(globals())
