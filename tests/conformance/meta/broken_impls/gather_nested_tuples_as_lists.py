"""Broken: `gather` of a nested structure turns tuples into lists.

Rule: nested structures are gathered leaf by leaf and keep their container
types. Caught at world 2 by ``gather.nested``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.gather")


def _lists(data):
    if isinstance(data, (list, tuple)):
        return [_lists(item) for item in data]
    if isinstance(data, dict):
        return {key: _lists(value) for key, value in data.items()}
    return data


def gather(tensor):
    return _lists(original(tensor))


ref.replace("utils.operations.gather", gather)
ref.export(globals())
