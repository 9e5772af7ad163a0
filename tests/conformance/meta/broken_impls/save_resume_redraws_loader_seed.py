"""Broken: a resumed loader draws its iterator's base seed from torch's RNG again, as HF accelerate 1.15 does.

Rule (save_state.resume_data_order, with save_state.roundtrip's restored RNG
states): resuming as the documents' checkpointing script does (``load_state``,
then ``skip_first_batches`` for the rest of the epoch) continues the run, so
each resumed step sees the random numbers the uninterrupted run's step saw.
The interrupted run drew the base seed as its epoch began, before it saved;
here the `skip_first_batches` copy that continues the epoch draws it again
from the restored RNG, so every resumed step's torch numbers are one draw
late (the rows are still right). Caught at world 2 by
``save_state_resume_as_documented``; ``save_state_resume_data_order``, which
compares batches only, passes.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _epoch_iterator(self, continuing):
    """The epoch's batches, the base seed drawn whether or not the epoch is continued."""
    return self._drawn_batches()


ref.replace("_data_loader.position.DataLoaderPositionMixin._epoch_iterator", _epoch_iterator)
ref.export(globals())
