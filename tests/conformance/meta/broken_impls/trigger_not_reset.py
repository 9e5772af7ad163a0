"""Broken: `check_trigger` never lowers the flag once it was raised.

Rule: after ``check_trigger()`` returned True it returns False until the next
``set_trigger()``. Caught at world 2 by ``trigger.set_check``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def check_trigger(self):
    import torch

    flag = self.flag_tensor if self.flag_tensor is not None else torch.tensor(0, device=self.device)
    raised = bool(self.reduce(flag.clone(), reduction="sum").item() >= 1)
    self.flag_tensor = torch.tensor(1, device=self.device) if raised else flag
    return raised


ref.replace("accelerator.Accelerator.check_trigger", check_trigger)
ref.export(globals())
