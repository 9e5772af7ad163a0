"""Broken: `print` prints on every process instead of once per machine.

Rule: ``accelerator.print`` prints on the local main process only. Caught at
world 2 by ``print.once_per_server``.
"""

import builtins

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def print(self, *args, **kwargs):  # noqa: A001 - the method being broken
    builtins.print(*args, **kwargs)


ref.replace("state.PartialState.print", print)
ref.export(globals())
