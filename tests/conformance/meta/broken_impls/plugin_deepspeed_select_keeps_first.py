"""Broken: ``select_deepspeed_plugin`` marks the named plugin selected but leaves the others selected too.

Rule: with ``Accelerator(deepspeed_plugins={name: plugin})`` exactly one
plugin is active; `AcceleratorState.select_deepspeed_plugin` makes the named
one active and the others not, so the next `prepare` uses its config. Caught
at world 2 by the ``plugin.deepspeed_config`` case
``plugin_deepspeed_several_plugins`` (where the deepspeed package is
installed): the first plugin stays active and the teacher gets ZeRO stage 2.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def select_deepspeed_plugin(self, name=None):
    self.deepspeed_plugins[name].select(_from_accelerator_state=True)


ref.replace("state.AcceleratorState.select_deepspeed_plugin", select_deepspeed_plugin)
ref.export(globals())
