"""Broken: `check_trigger` looks only at this rank's flag (no reduction across ranks).

Rule: ``set_trigger()`` on one rank makes ``check_trigger()`` True on every
rank. Caught at world 2 by ``trigger.set_check``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def check_trigger(self):
    raised = self.flag_tensor is not None and bool(self.flag_tensor.item() >= 1)
    self.flag_tensor = None
    return raised


ref.replace("accelerator.Accelerator.check_trigger", check_trigger)
ref.export(globals())
