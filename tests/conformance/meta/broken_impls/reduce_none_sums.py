"""Broken: `reduce(..., reduction="none")` sums across ranks (HF accelerate 1.15 does this).

Rule: ``reduction="none"`` returns the input unchanged. Caught at world 2 by
``reduce.none``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.reduce")


def reduce(tensor, reduction="mean", scale=1.0):
    return original(tensor, "sum" if reduction == "none" else reduction, scale)


ref.replace("utils.operations.reduce", reduce)
ref.export(globals())
