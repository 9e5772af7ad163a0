"""Broken: `split_between_processes` splits a dict whose values differ in length without complaint.

Rule: dict values of unequal length are rejected with a clear error. Caught
at world 2 by ``split.tensor_dict``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("state._split")


def _split(inputs, num_processes, index, apply_padding, device):
    if isinstance(inputs, dict):
        return {key: original(value, num_processes, index, apply_padding, device) for key, value in inputs.items()}
    return original(inputs, num_processes, index, apply_padding, device)


ref.replace("state._split", _split)
ref.export(globals())
