"""Broken: `is_comet_ml_available` answers False even when comet_ml is installed.

Rule: the ``is_<package>_available`` checks answer truthfully. Caught at
world 1 by ``env.checks`` (with its stand-in comet_ml package installed).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def is_comet_ml_available():
    return False


ref.replace("utils.imports.is_comet_ml_available", is_comet_ml_available)
ref.export(globals())
