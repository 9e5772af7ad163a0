"""Broken: ``TorchDynamoPlugin(use_regional_compilation=True)`` is ignored: prepare compiles the whole model.

Rule: with regional compilation each repeated block is compiled on its own and the
model keeps its class. Caught by ``plugin.dynamo`` (``plugin_dynamo_regional``).
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def compile_model(model, plugin):
    if str(plugin.backend).upper() == "NO":
        return model
    return torch.compile(model, **plugin.to_kwargs())


ref.replace("_accelerator.engines.compile_model", compile_model)
ref.export(globals())
