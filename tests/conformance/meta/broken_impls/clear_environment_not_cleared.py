"""Broken: `clear_environment` does not empty `os.environ` (it only restores it afterwards).

Rule: inside the block ``os.environ`` is empty. Caught at world 1 by
``env.clear_environment``.
"""

import os
from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def clear_environment():
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


ref.replace("utils.environment.clear_environment", clear_environment)
ref.export(globals())
