"""Broken: `patch_environment` restores the environment only when the block ends normally.

Rule: the environment is restored also when the block raises. Caught at
world 1 by ``env.patch_environment``.
"""

import os
from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def patch_environment(**kwargs):
    patched = {key.upper(): str(value) for key, value in kwargs.items()}
    previous = {key: os.environ.get(key) for key in patched}
    os.environ.update(patched)
    yield  # no try/finally: an exception in the block skips the restore
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


ref.replace("utils.environment.patch_environment", patch_environment)
ref.export(globals())
