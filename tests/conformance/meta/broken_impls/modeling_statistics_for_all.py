"""Broken: ``load_offloaded_weights`` gives every offloaded tensor 8-bit statistics (``SCB``), not only the
weights the index has an ``SCB`` entry for.

Rule (modeling.offload_roundtrip; HF 1.15's): an index entry ``x.SCB`` is the statistics of ``x.weight`` and
becomes ``x.weight.SCB``; no other parameter gets one. Here each tensor without ``"weight"`` in its name gets
itself as statistics, as a mutant of the twin's test did (issue 24). Caught by ``offload_roundtrip``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.modeling.load_offloaded_weights")


def load_offloaded_weights(model, index, offload_folder):
    original(model, index, offload_folder)
    for name, parameter in model.named_parameters():
        if name in (index or {}) and "weight" not in name:
            parameter.SCB = parameter.data


ref.replace("utils.modeling.load_offloaded_weights", load_offloaded_weights)
ref.export(globals())
