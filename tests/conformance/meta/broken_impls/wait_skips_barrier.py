"""Broken: `wait_for_everyone` returns at once without a barrier.

Rule: no rank leaves ``wait_for_everyone()`` before every rank (the main
process included) has arrived. Caught at world 2 by ``sync.wait_for_everyone``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def wait_for_everyone(self):
    return None


ref.replace("state.PartialState.wait_for_everyone", wait_for_everyone)
ref.export(globals())
