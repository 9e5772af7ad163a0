"""Broken: `load_and_quantize_model` returns the model with its Linear layers untouched.

Rule: the ``nn.Linear`` layers (except ``skip_modules``) become bitsandbytes
8-bit layers. Caught by ``quantization.load_and_quantize``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def load_and_quantize_model(model, bnb_quantization_config, weights_location=None, device_map=None, **_options):
    return model


ref.replace("utils.bnb.load_and_quantize_model", load_and_quantize_model)
ref.export(globals())
