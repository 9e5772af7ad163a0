"""Broken: `prepare` never wraps a model in `DistributedDataParallel`; ranks train apart.

Rule: N prepared ranks train to the weights of one process on the full batch.
Caught at world 2 by ``train.ddp_equivalence`` and ``prepare.unwrap``; every
rule resting on gradient synchronisation fails with it.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("accelerator.Accelerator.prepare_model")


def prepare_model(self, model, device_placement=None, evaluation_mode=False):
    return original(self, model, device_placement=device_placement, evaluation_mode=True)


ref.replace("accelerator.Accelerator.prepare_model", prepare_model)
ref.export(globals())
