"""Broken: the compiled model computes something else than the eager one (off by one part in a thousand).

Rule: a model prepared with ``dynamo_backend`` / ``TorchDynamoPlugin`` (whole or regional compilation) gives the
eager model's outputs, within the tolerances torch's tests use for the dtype. Caught by ``plugin.dynamo``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("_accelerator.engines.compile_model")


def _drift(module, inputs, output):
    return output * 1.001


def compile_model(model, plugin):
    last = list(model.modules())[-1]  # the head: its output is the model's
    last.register_forward_hook(_drift)
    return original(model, plugin)


ref.replace("_accelerator.engines.compile_model", compile_model)
ref.export(globals())
