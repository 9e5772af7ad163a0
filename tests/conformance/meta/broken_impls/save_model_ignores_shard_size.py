"""Broken: ``save_model`` ignores ``max_shard_size`` and always writes one file.

Rule: weights above ``max_shard_size`` are split into numbered shards with
an ``.index.json``. Caught at world 1 by ``save_model.sharded``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("_accelerator.checkpointing.CheckpointingMixin.save_model")


def save_model(self, model, save_directory, max_shard_size="10GB", safe_serialization=True):
    return original(self, model, save_directory, "10GB", safe_serialization)


ref.replace("_accelerator.checkpointing.CheckpointingMixin.save_model", save_model)
ref.export(globals())
