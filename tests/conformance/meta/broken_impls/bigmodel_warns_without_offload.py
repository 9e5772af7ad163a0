"""Broken: ``dispatch_model`` warns of offloaded parameters when the map offloads nothing.

Rule (bigmodel.dispatch_model; HF 1.15's words): one warning, "Some parameters are on the meta device because
they were offloaded to the ...", names the ``"cpu"``/``"disk"`` entries of the map; a map of accelerators only
logs none. Here the warning comes after every dispatch. Caught on ``sim-npu`` by ``dispatch_across_npus`` (a
surviving mutant of the warning's condition, issue 24).
"""

import logging

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("big_modeling.dispatch_model")


def dispatch_model(model, device_map, *args, **kwargs):
    dispatched = original(model, device_map, *args, **kwargs)
    if not {"cpu", "disk"} & set(device_map.values()):
        logging.getLogger("accelerate_ref.big_modeling").warning(
            "Some parameters are on the meta device because they were offloaded to the .")
    return dispatched


ref.replace("big_modeling.dispatch_model", dispatch_model)
ref.export(globals())
