"""Broken: the FSDP plugin replicates: every rank holds every parameter whole (NO_SHARD whatever was asked).

Rule: FULL_SHARD / SHARD_GRAD_OP hold 1/N of the parameters per rank. Caught
at world 2 by ``plugin.fsdp`` and the ``plugin.fsdp_strategies`` cases
of FULL_SHARD and SHARD_GRAD_OP.
"""

import dataclasses

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.fsdp_utils.shard_model")


def shard_model(model, plugin, state):
    return original(model, dataclasses.replace(plugin, sharding_strategy="NO_SHARD"), state)


ref.replace("utils.fsdp_utils.shard_model", shard_model)
ref.export(globals())
