"""Broken: `main_process_first` lets every rank run the block at once.

Rule: inside ``main_process_first()`` the main process runs the block and
leaves it before any other rank enters. Caught at world 2 by
``sync.main_process_first``.
"""

from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def main_process_first(self):
    yield


ref.replace("state.PartialState.main_process_first", main_process_first)
ref.export(globals())
