"""Broken: ``register_for_checkpointing`` accepts objects without ``state_dict`` / ``load_state_dict``.

Rule: such an object is rejected at once with an error saying what it
lacks. Here it is registered, and only a later save would fail. Caught at
world 1 by ``register_for_checkpointing``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def register_for_checkpointing(self, *objects):
    self._custom_objects.extend(objects)


ref.replace("_accelerator.checkpointing.CheckpointingMixin.register_for_checkpointing", register_for_checkpointing)
ref.export(globals())
