"""Broken: ``dispatch_model`` accepts a device map with ``"disk"`` entries but no ``offload_dir``.

Rule (bigmodel.dispatch_model): disk entries are kept in an offload folder;
without one (and without an offload index) HF 1.15 refuses, naming
``offload_dir`` and the submodules, before it changes anything. Here the
refusal is gone: the model is dispatched with its disk blocks nowhere to go.
Caught by ``bigmodel.dispatch_model``'s ``dispatch_cpu_disk`` (a surviving
mutant of the refusal's condition, issue 24).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("big_modeling.dispatch_model")


def dispatch_model(model, device_map, main_device=None, state_dict=None, offload_dir=None, offload_index=None, **kwargs):
    if offload_dir is None and offload_index is None and "disk" in device_map.values():
        offload_index = {}  # as if an (empty) index held the disk weights: no refusal
    return original(model, device_map, main_device=main_device, state_dict=state_dict, offload_dir=offload_dir,
                    offload_index=offload_index, **kwargs)


ref.replace("big_modeling.dispatch_model", dispatch_model)
ref.export(globals())
