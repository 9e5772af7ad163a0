"""Broken: removing an offloading ``AlignDevicesHook`` leaves the module's weights on meta.

Rule (bigmodel.cpu_offload, hooks.add_remove): ``remove_hook_from_module``
restores the module, its offloaded weights back where they were before the
hook (on the CPU for ``cpu_offload``). Caught by ``bigmodel.cpu_offload``,
which removes the hooks after its forwards and runs the model again (a
mutant of ``AlignDevicesHook.detach_hook`` the suite let through, issue 24).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
hook_class = ref.get("hooks.AlignDevicesHook")


def detach_hook(self, module):
    return module  # the weights stay on meta


hook_class.detach_hook = detach_hook
ref.export(globals())
