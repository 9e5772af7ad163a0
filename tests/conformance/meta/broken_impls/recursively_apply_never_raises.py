"""Broken: `recursively_apply` ignores `error_on_other_type` (other leaves are always kept).

Rule: with ``error_on_other_type=True`` a leaf that ``test_type`` rejects
raises a TypeError. Caught at world 1 by ``ops.recursively_apply``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils._operations.structures.recursively_apply")


def recursively_apply(func, data, *args, test_type=None, error_on_other_type=False, **kwargs):
    if test_type is not None:
        kwargs["test_type"] = test_type
    return original(func, data, *args, error_on_other_type=False, **kwargs)


ref.replace("utils._operations.structures.recursively_apply", recursively_apply)
ref.export(globals())
