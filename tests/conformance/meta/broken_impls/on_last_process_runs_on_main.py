"""Broken: `on_last_process` runs the function on the main process.

Rule: the decorated function runs on the last rank only. Caught at world 2
by ``process.on_last_process``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
do_nothing = ref.get("state.do_nothing")


def on_last_process(self, function=None):
    return function if self.is_main_process or not self.use_distributed else do_nothing


ref.replace("state.PartialState.on_last_process", on_last_process)
ref.export(globals())
