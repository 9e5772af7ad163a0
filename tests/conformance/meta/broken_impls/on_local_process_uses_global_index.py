"""Broken: `on_local_process(local_process_index=k)` compares `k` with the global rank.

Rule: the decorated function runs on local rank ``k`` of every machine.
Caught at world 2x2 (k = 1: ranks 1 and 3) by ``process.on_local_process``.
"""

from functools import partial

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
do_nothing = ref.get("state.do_nothing")


def on_local_process(self, function=None, local_process_index=None):
    if function is None:
        return partial(self.on_local_process, local_process_index=local_process_index)
    return function if self.process_index == local_process_index or not self.use_distributed else do_nothing


ref.replace("state.PartialState.on_local_process", on_local_process)
ref.export(globals())
