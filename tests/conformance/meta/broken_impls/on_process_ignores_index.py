"""Broken: `on_process(process_index=k)` runs the function on rank 0 whatever `k` is.

Rule: the decorated function runs on rank ``process_index`` only. Caught at
world 2 (index 1) by ``process.on_process``.
"""

from functools import partial

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
do_nothing = ref.get("state.do_nothing")


def on_process(self, function=None, process_index=None):
    if function is None:
        return partial(self.on_process, process_index=process_index)
    return function if self.process_index == 0 or not self.use_distributed else do_nothing


ref.replace("state.PartialState.on_process", on_process)
ref.export(globals())
