"""Broken: ``shard_checkpoint`` packs the biggest weights first instead of keeping the key order.

Rule: shards follow the order of the keys: sizes [6, 6, 2, 6, 2, 2] at a
limit of 10 give [6], [6+2], [6+2+2] (the document says explicitly that no
reordering is done). Here the weights are sorted by size first. Caught at
world 1 by ``shard_checkpoint.doc_example``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.modeling.shard_checkpoint")


def shard_checkpoint(state_dict, max_shard_size="10GB", weights_name="pytorch_model.bin"):
    biggest_first = dict(sorted(state_dict.items(), key=lambda item: -item[1].numel() * item[1].element_size()))
    return original(biggest_first, max_shard_size, weights_name)


ref.replace("utils.modeling.shard_checkpoint", shard_checkpoint)
ref.export(globals())
