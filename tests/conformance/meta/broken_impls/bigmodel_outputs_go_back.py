"""Broken: ``dispatch_model`` sends every dispatched block's output back to the device its input came from.

Rule (bigmodel.dispatch_model): inputs follow the model; only the model's own output returns to the input's
device, and a block's output stays on the block's device (the next block's hook moves it on). Here each
block's hook returns its output to where its input was, a copy per block and per forward. Caught on
``sim-npu`` by ``dispatch_across_npus``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("big_modeling.dispatch_model")
AlignDevicesHook = ref.get("hooks.AlignDevicesHook")


def dispatch_model(model, device_map, *args, **kwargs):
    dispatched = original(model, device_map, *args, **kwargs)
    for module in dispatched.modules():
        hook = getattr(module, "_hf_hook", None)
        if isinstance(hook, AlignDevicesHook):
            hook.io_same_device = True
    return dispatched


ref.replace("big_modeling.dispatch_model", dispatch_model)
ref.export(globals())
