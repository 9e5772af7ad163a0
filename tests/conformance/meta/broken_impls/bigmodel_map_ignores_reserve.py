"""Broken: ``infer_auto_device_map`` keeps no room on accelerator 0 (or the CPU) for the layers offloaded past it.

Rule 4 of modeling.device_map: when the map spills to the CPU, accelerator
0 keeps room for the largest layer offloaded there (it runs it), and when
it spills to disk, the CPU keeps room for the largest layer read from disk.
Here no device reserves anything. Caught at world 1 by ``modeling.device_map``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.replace("utils._modeling.device_map.reserving_devices", lambda budget: [])
ref.export(globals())
