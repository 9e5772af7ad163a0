"""Broken: `is_main_process` is true on every machine's local main process.

Rule: ``is_main_process`` is true on exactly one rank overall. Caught at
world 2x2 by ``process.is_main`` (and ``state.attributes``).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@property
def is_main_process(self):
    return self.local_process_index == 0


ref.replace("state.PartialState.is_main_process", is_main_process)
ref.export(globals())
