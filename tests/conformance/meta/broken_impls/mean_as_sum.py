"""Broken: `reduce(..., reduction="mean")` returns the sum (no division by `num_processes`).

Rule: ``reduction="mean"`` divides the sum by ``num_processes``. Caught at
world 2 by ``reduce.mean`` (and ``reduce.nested``, which reduces a structure
with "mean" too).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.reduce")


def reduce(tensor, reduction="mean", scale=1.0):
    return original(tensor, "sum" if reduction == "mean" else reduction, scale)


ref.replace("utils.operations.reduce", reduce)
ref.export(globals())
