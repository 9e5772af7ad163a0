"""Broken: ``load_state`` restores nothing of a prepared data loader, so a resumed run shuffles afresh.

Rule: after ``load_state``, ``skip_first_batches(loader, n)`` and then the
loader yield exactly what the interrupted run would have (the epoch, the
generator its order comes from, the sampler's seed are restored). Here the
loader's ``load_state_dict`` ignores the saved position, as HF accelerate
does (accelerate issue #3996): the resumed loader starts epoch 0 of a new
shuffle. Caught at world 1 by ``save_state.resume_data_order``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def load_state_dict(self, state_dict):
    """Accepts the saved position and keeps none of it."""


ref.replace("data_loader.DataLoaderPositionMixin.load_state_dict", load_state_dict)
ref.export(globals())
