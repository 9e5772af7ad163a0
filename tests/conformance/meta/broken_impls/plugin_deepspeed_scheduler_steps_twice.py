"""Broken: under DeepSpeed, the prepared scheduler's ``step()`` steps the engine's scheduler, which the engine steps too.

Rule: a scheduler DeepSpeed's engine drives (the config's, through
`DummyScheduler`) steps once per optimizer step, in ``engine.step()``; the
prepared `DeepSpeedSchedulerWrapper`'s ``step()`` does nothing. Caught at
world 2 by the ``plugin.deepspeed_config`` case ``plugin_deepspeed_dummy_optim``
(where the deepspeed package is installed): the warmup runs twice as fast.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def step(self):
    self.scheduler.step()


ref.replace("utils.deepspeed.DeepSpeedSchedulerWrapper.step", step)
ref.export(globals())
