"""Broken: ``load_checkpoint_in_model`` reads every shard of the checkpoint into RAM before placing any weight.

Rule (bigmodel.load_checkpoint_and_dispatch): loading stays within every
budget, the CPU's included, so a checkpoint offloaded to disk is never held
in memory whole. Here all shards are loaded first. Caught at world 1 by
``bigmodel.load_checkpoint_and_dispatch`` (``load_within_cpu_budget``).
"""

import os

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
modeling = ref.module("utils.modeling")


def load_checkpoint_in_model(model, checkpoint, *args, **kwargs):
    everything = {}
    for path in modeling.checkpoint_files(os.fspath(checkpoint)):
        everything.update({name: tensor.clone() for name, tensor in modeling.load_state_dict(os.fspath(path)).items()})
    try:
        return loader(model, checkpoint, *args, **kwargs)
    finally:
        del everything


loader = ref.replace("utils.modeling.load_checkpoint_in_model", load_checkpoint_in_model)
ref.export(globals())
