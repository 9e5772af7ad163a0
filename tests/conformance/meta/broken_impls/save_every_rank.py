"""Broken: ``accelerator.save(obj, f)`` writes on every process instead of once.

Rule: the main process writes (with ``save_on_each_node``, each machine's
local main process). Here every rank pickles and writes the object. Caught
at world 2 by ``save.once_per_machine`` (and, with 🤗 Transformers 4 installed,
by ``save.transformers_save_pretrained``, whose ``save_function`` is
``accelerator.save``; Transformers 5 ignores that hook); checkpoints stay
correct (every rank writes the same bytes atomically), so the other saving
cases pass.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
serialization = ref.module("utils._other.serialization")


def save(obj, f, save_on_each_node=False, safe_serialization=False):
    serialization.write_object(obj, f, safe_serialization=safe_serialization)


ref.replace("utils._other.serialization.save", save)
ref.export(globals())
