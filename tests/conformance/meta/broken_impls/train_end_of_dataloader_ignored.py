"""Broken: `accumulate` ignores the end of the data loader (``sync_with_dataloader``).

Rule: with ``sync_with_dataloader=True`` the last batch of a prepared loader
synchronises gradients even mid-cycle, and the count restarts with the next
epoch. Caught at world 2 by ``accumulate.end_of_dataloader``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _count_step(self):
    self.step += 1
    self.gradient_state._set_sync_gradients(self.step % self.gradient_state.num_steps == 0)


ref.replace("accelerator.Accelerator._count_step", _count_step)
ref.export(globals())
