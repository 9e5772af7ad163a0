"""Broken: ``handle.remove()`` of a save or load pre-hook does not remove the hook.

Rule: ``register_save_state_pre_hook`` / ``register_load_state_pre_hook``
return a ``RemovableHandle`` whose ``remove()`` unregisters the hook. Here
the handle points at a registry of its own, so the hook keeps running.
Caught at world 1 by ``save_state.pre_hooks``.
"""

import collections

from broken_impls._wrap import BrokenCopy
from torch.utils.hooks import RemovableHandle

ref = BrokenCopy(__name__)
#: The registry the handles point at: removing from it leaves the Accelerator's hooks alone.
_ELSEWHERE: collections.OrderedDict = collections.OrderedDict()


def _detached(registry_name):
    def register(self, hook):
        handle = RemovableHandle(_ELSEWHERE)
        getattr(self, registry_name)[handle.id] = hook
        return handle

    return register


ref.replace("_accelerator.checkpointing.CheckpointingMixin.register_save_state_pre_hook", _detached("_save_model_state_pre_hook"))
ref.replace("_accelerator.checkpointing.CheckpointingMixin.register_load_state_pre_hook", _detached("_load_model_state_pre_hook"))
ref.export(globals())
