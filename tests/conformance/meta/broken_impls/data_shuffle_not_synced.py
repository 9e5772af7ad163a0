"""Broken: prepared loaders never synchronise the random generators named in ``rng_types``.

Rule: with ``shuffle=True`` all ranks shuffle identically each epoch (the
generators in ``rng_types`` take rank 0's state when an epoch starts), so
shards stay disjoint. Here each rank shuffles with its own generator. Caught
at world 2 by ``data.shuffle_sync``, whose ranks seed torch differently.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def synchronize_rng_states(rng_types, generator=None):
    pass


ref.replace("utils.random.synchronize_rng_states", synchronize_rng_states)
ref.export(globals())
