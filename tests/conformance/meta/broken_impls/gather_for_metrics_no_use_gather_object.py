"""Broken: `gather_for_metrics` has no `use_gather_object` keyword (as before accelerate 0.30).

Rule (A v1.x): ``gather_for_metrics(..., use_gather_object=True)`` gathers
non-tensor objects. A script passing it stops with a TypeError: caught at
world 2 by ``gather_for_metrics.use_gather_object`` as ERROR.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("accelerator.Accelerator.gather_for_metrics")


def gather_for_metrics(self, input_data):
    return original(self, input_data)


ref.replace("accelerator.Accelerator.gather_for_metrics", gather_for_metrics)
ref.export(globals())
