"""Broken: `dynamo_backend` / `TorchDynamoPlugin` are stored but the model is never compiled.

Rule: prepare compiles the model with torch.compile. Caught by ``plugin.dynamo``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def compile_model(model, plugin):
    return model


ref.replace("_accelerator.engines.compile_model", compile_model)
ref.export(globals())
