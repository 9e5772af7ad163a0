"""Broken: the prepared scheduler steps on every micro-batch, accumulating or not.

Rule: with ``adjust_scheduler`` (the default) a prepared scheduler steps only
with the optimizer's real updates. Caught at world 2 by ``accumulate.scheduler``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def step(self, *args, **kwargs):
    self.scheduler.step(*args, **kwargs)


ref.replace("scheduler.AcceleratedScheduler.step", step)
ref.export(globals())
