"""Broken: `send_to_device` moves the values under `skip_keys` too.

Rule: values under a key in ``skip_keys`` stay where they are. Caught at
world 1 by ``ops.send_to_device``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils._operations.structures.send_to_device")


def send_to_device(tensor, device, non_blocking=False, skip_keys=None):
    return original(tensor, device, non_blocking=non_blocking, skip_keys=None)


ref.replace("utils._operations.structures.send_to_device", send_to_device)
ref.export(globals())
