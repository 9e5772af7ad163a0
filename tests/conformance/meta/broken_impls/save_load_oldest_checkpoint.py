"""Broken: ``load_state()`` with automatic checkpoint naming loads the oldest checkpoint, not the latest.

Rule: with ``automatic_checkpoint_naming``, ``load_state()`` without a
directory loads the newest complete checkpoint. Caught at world 1 by
``save_state.auto_naming`` and ``save_state.total_limit`` (which loads the
newest of the two checkpoints it keeps).
"""

import os

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
store = ref.module("_checkpointing.store")
original = ref.get("_accelerator.checkpointing.CheckpointingMixin._checkpoint_to_load")


def _checkpoint_to_load(self, input_dir):
    config = self.project_configuration
    if input_dir is None and config.automatic_checkpoint_naming:
        return store.published_in(os.path.join(config.project_dir, store.CHECKPOINTS_FOLDER))[0][1]
    return original(self, input_dir)


ref.replace("_accelerator.checkpointing.CheckpointingMixin._checkpoint_to_load", _checkpoint_to_load)
ref.export(globals())
