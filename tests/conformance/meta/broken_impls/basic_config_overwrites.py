"""Broken: `write_basic_config` overwrites an existing file.

Rule: it refuses to overwrite. Caught at world 1 by ``config.write_basic_config``.
"""

import os

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("commands.config.default.write_basic_config")


def write_basic_config(mixed_precision="no", save_location=None):
    if save_location is not None and os.path.exists(save_location):
        os.remove(save_location)
    return original(mixed_precision, save_location)


ref.replace("commands.config.default.write_basic_config", write_basic_config)
ref.export(globals())
