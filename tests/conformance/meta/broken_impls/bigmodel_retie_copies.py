"""Broken: ``retie_parameters`` gives each tied name an equal copy instead of the one shared Parameter.

Rule (modeling.tied_parameters): after retie the group is one Parameter
again (an update of one is an update of all). Caught at world 1 by
``modeling.tied_parameters`` and ``modeling.tensor_to_device``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def retie_parameters(model, tied_params):
    for group in tied_params:
        parameters = [model.get_parameter(name) for name in group]
        source = next((p for p in parameters if not p.is_meta), parameters[0])
        for name in group:
            module_name, _, attribute = name.rpartition(".")
            copy = torch.nn.Parameter(source.detach().clone(), requires_grad=source.requires_grad)
            setattr(model.get_submodule(module_name), attribute, copy)


ref.replace("utils._modeling.sizes.retie_parameters", retie_parameters)
ref.export(globals())
