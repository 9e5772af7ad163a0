"""Broken: `patch_environment` sets the names as given instead of upper-casing them.

Rule: ``patch_environment(foo="bar")`` sets ``FOO``. Caught at world 1 by
``env.patch_environment``.
"""

import os
from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def patch_environment(**kwargs):
    previous = {key: os.environ.get(key) for key in kwargs}
    os.environ.update({key: str(value) for key, value in kwargs.items()})
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


ref.replace("utils.environment.patch_environment", patch_environment)
ref.export(globals())
