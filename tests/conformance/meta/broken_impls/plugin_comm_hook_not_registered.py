"""Broken: `DistributedDataParallelKwargs(comm_hook=...)` is accepted but no hook is registered.

Rule: prepare registers torch's DDP communication hook. Caught at world 2 by
``plugin.ddp_comm_hook``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def register_comm_hook(self, model):
    return None


ref.replace("utils.dataclasses.DistributedDataParallelKwargs.register_comm_hook", register_comm_hook)
ref.export(globals())
