"""Broken: `free_memory` resets ``step`` but keeps its references to the prepared objects.

Rule: after ``free_memory()`` the Accelerator holds nothing it prepared, so
the objects are freed once the script drops them. Caught at world 2 by
``free_memory.resets``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def free_memory(self, *objects):
    self.step = 0
    return [None] * len(objects)


ref.replace("accelerator.Accelerator.free_memory", free_memory)
ref.export(globals())
