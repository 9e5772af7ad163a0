"""Broken: `listify` leaves 0-d tensors as tensors.

Rule: tensors anywhere in a nested structure become Python lists or numbers.
Caught at world 1 by ``ops.listify``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
recursively_apply = ref.get("utils._operations.structures.recursively_apply")


def listify(data):
    def to_list(tensor):
        if tensor.ndim == 0:
            return tensor
        return tensor.detach().cpu().float().tolist() if tensor.is_floating_point() else tensor.tolist()

    return recursively_apply(to_list, data)


ref.replace("utils._operations.structures.listify", listify)
ref.export(globals())
