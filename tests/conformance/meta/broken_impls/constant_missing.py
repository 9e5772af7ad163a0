"""Broken: `SAFE_WEIGHTS_INDEX_NAME` is missing from `utils`.

Rule: the documented constants exist. A script using the name stops with an
AttributeError: caught at world 1 by ``constants.names`` as ERROR.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.remove("utils.constants.SAFE_WEIGHTS_INDEX_NAME")
ref.export(globals())
