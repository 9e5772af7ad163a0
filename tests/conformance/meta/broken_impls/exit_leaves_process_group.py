"""Broken: the process group is left up at interpreter exit (no teardown registered).

Rule: a script that returns normally exits 0 on every rank; the reference
destroys the default process group from an ``atexit`` callback, before Python
finalizes, so that gloo's worker threads cannot abort the rank. Caught at
world 2 by ``state.clean_exit``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _tear_down_at_exit() -> None:
    """Register nothing: the group lives on into interpreter finalization."""


ref.replace("state._tear_down_at_exit", _tear_down_at_exit)
ref.export(globals())
