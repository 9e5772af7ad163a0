"""Broken: ``AlignDevicesHook`` brings the weights to the execution device but leaves the inputs where they are.

Rule (bigmodel.dispatch_model): inputs follow the model through hooks. On
the CPU alone nothing needs moving, so this shows only with several
accelerators: caught on ``sim-npu`` (four mock NPUs) by
``bigmodel.dispatch_model``, where a tensor of npu:1 meets one of npu:0.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
hook_class = ref.get("hooks.AlignDevicesHook")
original = hook_class.pre_forward


def pre_forward(self, module, *args, **kwargs):
    original(self, module, *args, **kwargs)  # weights moved, the moved inputs thrown away
    return args, kwargs


hook_class.pre_forward = pre_forward
ref.export(globals())
