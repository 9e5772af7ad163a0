"""Broken: under FSDP, ``load_state`` restores the sharded model but not the optimizer.

Rule: `save_state` / `load_state` round-trip the optimizer's state too, so
training after `load_state` follows the uninterrupted run bit for bit.
Caught at world 2 by the ``plugin.fsdp_state_dict`` cases
``plugin_fsdp_save_state_full`` and ``plugin_fsdp_save_state_sharded``
(Adam's moments and step count stay where a later step left them).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def load_fsdp_optimizer(fsdp_plugin, accelerator, optimizer, model, input_dir, optimizer_index=0):
    accelerator.wait_for_everyone()  # takes part like the real one, loads nothing


ref.replace("utils.fsdp_utils.load_fsdp_optimizer", load_fsdp_optimizer)
ref.export(globals())
