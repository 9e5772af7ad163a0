"""Broken: `clear_environment` puts the old variables back but keeps those added inside the block.

Rule: on exit the environment from before is restored exactly; changes made
inside are discarded. Caught at world 1 by ``env.clear_environment``.
"""

import os
from contextlib import contextmanager

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


@contextmanager
def clear_environment():
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.update(saved)


ref.replace("utils.environment.clear_environment", clear_environment)
ref.export(globals())
