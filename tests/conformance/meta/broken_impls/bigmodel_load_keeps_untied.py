"""Broken: ``load_checkpoint_in_model`` does not tie the tied weights again after loading.

Rule (modeling.tied_parameters): loading puts a new tensor under each name
it reads, which unties a group of tied weights; the loader restores the
ties at the end (`retie_parameters`), so the group is one Parameter again.
Here the loader's closing retie is dropped: the tied names stay two
Parameters (or, where the checkpoint holds one name of the group, the
other stays on ``meta``). Caught at world 1 by ``load_checkpoint_reties``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
modeling = ref.module("utils.modeling")
original = modeling.load_checkpoint_in_model


def load_checkpoint_in_model(model, checkpoint, *args, **kwargs):
    """The reference's loader with its closing `retie_parameters` made a no-op."""
    retie = modeling.retie_parameters
    modeling.retie_parameters = lambda model, tied_params: None
    try:
        return original(model, checkpoint, *args, **kwargs)
    finally:
        modeling.retie_parameters = retie


ref.replace("utils.modeling.load_checkpoint_in_model", load_checkpoint_in_model)
ref.export(globals())
