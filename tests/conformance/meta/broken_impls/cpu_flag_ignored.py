"""Broken: `Accelerator(cpu=True)` is ignored; the accelerator found on the machine is used.

Rule: ``cpu=True`` uses the CPU even where an accelerator exists. Caught by
``cpu.flag`` at world 1 only on a machine with CUDA: on a CPU-only machine
the break and the rule give the same device.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _ignore_cpu(original):
    def __init__(self, *args, cpu=False, **kwargs):
        original(self, *args, cpu=False, **kwargs)

    return __init__


ref.patch_method("accelerator.Accelerator.__init__", _ignore_cpu)
ref.export(globals())
