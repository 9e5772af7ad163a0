"""Broken: a sharded FSDP save writes only rank 0's shard.

Rule: SHARDED_STATE_DICT checkpoints hold every rank's shard, so loading and
`merge_fsdp_weights` give back the whole model. Caught at world 2 by the
``plugin.fsdp_state_dict`` cases
``plugin_fsdp_state_dict_sharded`` and ``plugin_fsdp_save_state_sharded``.
"""

import os

import torch.distributed.checkpoint as dcp
from broken_impls._wrap import BrokenCopy
from torch.distributed.checkpoint.state_dict import get_model_state_dict

ref = BrokenCopy(__name__)
original = ref.get("utils.fsdp_utils.save_fsdp_model")


def save_fsdp_model(fsdp_plugin, accelerator, model, output_dir, model_index=0, adapter_only=False, use_dcp=True):
    if fsdp_plugin.state_dict_type.name != "SHARDED_STATE_DICT":
        return original(fsdp_plugin, accelerator, model, output_dir, model_index, adapter_only, use_dcp)
    state = {"model": get_model_state_dict(model)}  # every rank takes part in gathering the state ...
    if accelerator.is_main_process:  # ... but only rank 0 writes, without the others
        dcp.save(state, checkpoint_id=os.path.join(output_dir, f"pytorch_model_fsdp_{model_index}"), no_dist=True)
    accelerator.wait_for_everyone()


ref.replace("utils.fsdp_utils.save_fsdp_model", save_fsdp_model)
ref.export(globals())
