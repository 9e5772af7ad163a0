"""Broken: the utility `reduce` defaults to "sum" (it is the Accelerator method that defaults to "sum").

Rule: ``accelerate.utils.reduce`` defaults to ``reduction="mean"``. Caught at
world 2 by ``reduce.mean``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.reduce")


def reduce(tensor, reduction="sum", scale=1.0):
    return original(tensor, reduction, scale)


ref.replace("utils.operations.reduce", reduce)
ref.export(globals())
