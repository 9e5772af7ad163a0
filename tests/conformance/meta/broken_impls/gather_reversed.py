"""Broken: `gather` concatenates the ranks' tensors in reverse rank order.

Rule: gathered blocks come in rank order (``[0, 1, 2, 3]`` at 4 processes).
Caught by ``gather.first_dim``, ``gather.nested`` and ``gather.scalar`` at
world 2, and by ``gather.doc_example`` at world 4.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils._operations.collectives.TorchDistributedCollectives.all_gather")


def all_gather(self, tensor):
    blocks = original(self, tensor).chunk(self.num_processes)
    return torch.cat(list(reversed(blocks)))


ref.replace("utils._operations.collectives.TorchDistributedCollectives.all_gather", all_gather)
ref.export(globals())
