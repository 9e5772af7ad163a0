"""Broken: `on_main_process` runs the function on every machine's local main process.

Rule: the decorated function runs on rank 0 only, once overall (the example's
"once per server" is an erratum). Caught at world 2x2 by
``process.on_main_process``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
do_nothing = ref.get("state.do_nothing")


def on_main_process(self, function=None):
    return function if self.is_local_main_process or not self.use_distributed else do_nothing


ref.replace("state.PartialState.on_main_process", on_main_process)
ref.export(globals())
