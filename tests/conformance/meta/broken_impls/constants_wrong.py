"""Broken: `SCALER_NAME` is "scaler.bin" instead of the documented "scaler.pt".

Rule: the checkpoint file-name constants have their documented values.
Caught at world 1 by ``constants.names``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.replace("utils.constants.SCALER_NAME", "scaler.bin")
ref.export(globals())
