"""Broken: an offloading ``AlignDevicesHook`` never sends the weights back after the forward.

Rule (bigmodel.cpu_offload): the weights are on the execution device only
during their module's forward. The outputs stay right, only the memory
promise is broken: caught by ``bigmodel.cpu_offload``, which looks at the
weights after a forward (issue 24's first example of a mutant the suite let
through), and by ``bigmodel.dispatch_model``, whose disk blocks must be back
on meta after theirs.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
hook_class = ref.get("hooks.AlignDevicesHook")
original = hook_class.post_forward


def post_forward(self, module, output):
    offload, self.offload = self.offload, False  # the weights stay where the forward put them
    try:
        return original(self, module, output)
    finally:
        self.offload = offload


hook_class.post_forward = post_forward
ref.export(globals())
