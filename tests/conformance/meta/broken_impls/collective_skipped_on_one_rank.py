"""Broken: `gather` skips the collective on the last rank (returns its input), so the others block.

Rule: every rank takes part in a collective (gather concatenates every
rank's tensor). The other ranks wait forever in all_gather: the suite must
report ``gather.first_dim`` at world 2 as HANG (or FAIL, when the last rank's
own wrong result is reported as the cause), and go on with the next case.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.operations.gather")


def gather(tensor):
    state = ref.module("state").PartialState()
    if state.use_distributed and state.is_last_process:
        return tensor
    return original(tensor)


ref.replace("utils.operations.gather", gather)
ref.export(globals())
