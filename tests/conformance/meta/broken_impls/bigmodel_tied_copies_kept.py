"""Broken: an offloading ``AlignDevicesHook`` keeps the execution device's copy of a tied weight after the forward.

Rule (bigmodel.dispatch_model): offloaded weights are on the execution device only during their module's
forward; a tied weight's copy is shared by the tied modules while they run and dropped after. Here the hook
forgets the copies it must drop, so each tied weight stays on the accelerator: caught on ``sim-npu`` by
``dispatch_tied_offloaded``, which reads the device's memory after a forward.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
hook_class = ref.get("hooks.AlignDevicesHook")
original = hook_class.post_forward


def post_forward(self, module, output):
    self.tied_pointers_to_remove = set()  # the copies recorded for removal are kept
    return original(self, module, output)


hook_class.post_forward = post_forward
ref.export(globals())
