"""Broken: `unwrap_model` returns the prepared model as it is, DDP wrapper included.

Rule: ``unwrap_model(prepared)`` is the user's ``MyModel``. Caught at world 2
by ``prepare.unwrap`` (and by ``prepare.order``, which unwraps too; with 🤗
Transformers installed, 4 or 5, by ``save.transformers_save_pretrained``: the
DDP wrapper has no ``save_pretrained``).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def unwrap_model(self, model, keep_fp32_wrapper=True, keep_torch_compile=True):
    return model


ref.replace("accelerator.Accelerator.unwrap_model", unwrap_model)
ref.export(globals())
