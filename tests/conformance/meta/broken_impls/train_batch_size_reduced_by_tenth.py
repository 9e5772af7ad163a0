"""Broken: `find_executable_batch_size` multiplies the batch size by 0.9 after an out-of-memory error (HF 1.15's back-off).

Rule: the decorated function is retried with half the batch size. Caught at
world 1 by ``memory.find_executable_batch_size``.
"""

import functools

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.memory.find_executable_batch_size")


def find_executable_batch_size(function=None, starting_batch_size=128, reduce_batch_size_fn=None):
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size)
    size = starting_batch_size

    def tenth_less():
        nonlocal size
        size = int(size * 0.9)
        return size

    return original(function, starting_batch_size=starting_batch_size, reduce_batch_size_fn=tenth_less)


ref.replace("utils.memory.find_executable_batch_size", find_executable_batch_size)
ref.export(globals())
