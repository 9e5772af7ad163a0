"""Broken: `local_process_index` is the global rank (the index on the machine is ignored).

Rule: ``local_process_index`` is the rank's index on its own machine, so
``is_local_main_process`` holds once per machine and ``print`` prints once
per machine. Caught at world 2x2 by ``state.attributes``,
``process.is_local_main`` and ``print.once_per_server``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _global_local_index(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.local_process_index = self.process_index

    return __init__


ref.patch_method("state.PartialState.__init__", _global_local_index)
ref.export(globals())
