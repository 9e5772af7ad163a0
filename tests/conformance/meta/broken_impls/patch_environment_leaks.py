"""Broken: `patch_environment` leaves its variables set after the block.

Rule: on exit, a variable that did not exist is removed and one that existed
gets its old value back. Caught at world 1 by ``env.patch_environment``.
"""

import os
from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def patch_environment(**kwargs):
    os.environ.update({key.upper(): str(value) for key, value in kwargs.items()})
    yield


ref.replace("utils.environment.patch_environment", patch_environment)
ref.export(globals())
