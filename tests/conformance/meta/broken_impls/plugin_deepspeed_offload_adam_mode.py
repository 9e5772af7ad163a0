"""Broken: ``map_pytorch_optim_to_deepspeed`` maps ``torch.optim.AdamW`` to DeepSpeed's CPU Adam in Adam mode.

Rule: with ZeRO's optimizer offload the torch optimizer becomes its DeepSpeed
CPU version with the same update: AdamW's decoupled weight decay
(``adamw_mode=True``), not Adam's L2 penalty. Caught at world 2 by the
``plugin.deepspeed_zero`` case ``plugin_deepspeed_offload_optimizer`` (where
the deepspeed package is installed): the weights drift from AdamW's.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def map_pytorch_optim_to_deepspeed(optimizer):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    defaults = {key: value for key, value in optimizer.defaults.items() if key in ("lr", "weight_decay")}
    return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=False, **defaults)


ref.replace("utils.deepspeed.map_pytorch_optim_to_deepspeed", map_pytorch_optim_to_deepspeed)
ref.export(globals())
