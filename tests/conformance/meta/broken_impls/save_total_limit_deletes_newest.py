"""Broken: ``total_limit`` keeps the oldest checkpoints and deletes the newest.

Rule: with ``total_limit=2`` only the two newest checkpoints remain. Here
pruning deletes every checkpoint after the first ``total_limit`` (the one
just saved included). Caught at world 1 by ``save_state.total_limit``.
"""

import shutil

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
store = ref.module("_checkpointing.store")


def prune(folder, total_limit, token):
    for _, path in store.published_in(folder)[total_limit:]:
        shutil.rmtree(path)


ref.replace("_checkpointing.store.prune", prune)
ref.export(globals())
