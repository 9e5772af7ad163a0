"""Broken: ``infer_auto_device_map`` ignores ``no_split_module_classes`` and splits those modules across devices.

Rule 3 of modeling.device_map: a module of a no-split class is placed
whole. Caught at world 1 by ``modeling.device_map`` and by
``bigmodel.load_checkpoint_and_dispatch`` (which checks the blocks whole).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils._modeling.device_map.infer_auto_device_map")


def infer_auto_device_map(model, max_memory=None, no_split_module_classes=None, *args, **kwargs):
    return original(model, max_memory, None, *args, **kwargs)


ref.replace("utils._modeling.device_map.infer_auto_device_map", infer_auto_device_map)
ref.export(globals())
