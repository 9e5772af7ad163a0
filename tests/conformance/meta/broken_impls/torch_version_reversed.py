"""Broken: `is_torch_version(op, v)` compares the other way round (`v op installed`).

Rule: ``is_torch_version(">=", "2.0")`` is true when the installed torch is
2.0 or newer. Caught at world 1 by ``env.checks``.
"""

from broken_impls._wrap import BrokenCopy
from packaging.version import parse

ref = BrokenCopy(__name__)
versions = ref.module("utils.versions")


def is_torch_version(operation, version):
    from importlib.metadata import version as installed

    return versions.compare_versions(parse(version), operation, installed("torch"))


ref.replace("utils.versions.is_torch_version", is_torch_version)
ref.export(globals())
