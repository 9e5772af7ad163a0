"""Broken: a loader saved in its epoch's last step resumes in that epoch, which it then replays.

Rule (save_state.resume_data_order): resuming at an epoch boundary as HF's
``examples/by_feature/checkpointing.py`` does (``save_state`` in the
epoch's last step; ``load_state``, then ``skip_first_batches(loader, 0)``
for the next epoch and the loader for the ones after) yields the next
epochs of the uninterrupted run. Here the complete epoch is saved as begun
with all its batches handed out (accelerate_ref before its fix): the
``skip_first_batches`` copy continues it from its recorded start, so every
resumed epoch is the one before it again (as with HF accelerate 1.15).
Caught at world 1 and 2 by both cases of ``save_state.resume_data_order``;
mid-epoch resumes still pass.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _epoch_complete(self):
    """Never complete: the epoch whose last batch was handed out is saved as still under way."""
    return False


ref.replace("_data_loader.position.DataLoaderPositionMixin._epoch_complete", _epoch_complete)
ref.export(globals())
