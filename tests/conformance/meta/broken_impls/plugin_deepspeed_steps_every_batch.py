"""Broken: under DeepSpeed, `Accelerator.backward` steps the engine after every batch, ignoring accumulation.

Rule: with ``gradient_accumulation_steps=N`` the engine steps once per N
batches (at the boundary ``sync_gradients`` marks). Caught at world 2 by the
``plugin.deepspeed_zero`` case ``plugin_deepspeed_accumulation`` (where the
deepspeed package is installed).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def backward(self, loss, sync_gradients=True, **kwargs):
    self.engine.set_gradient_accumulation_boundary(is_boundary=True)  # every batch is a boundary
    self.engine.backward(loss, **kwargs)
    self.engine.step()


ref.replace("utils.deepspeed.DeepSpeedEngineWrapper.backward", backward)
ref.export(globals())
