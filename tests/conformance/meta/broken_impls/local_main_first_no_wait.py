"""Broken: `local_main_process_first` lets every rank run the block at once.

Rule: per machine, local rank 0 runs the block and leaves it before the
machine's other ranks enter. Caught at world 2 by
``sync.local_main_process_first``.
"""

from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def local_main_process_first(self):
    yield


ref.replace("state.PartialState.local_main_process_first", local_main_process_first)
ref.export(globals())
