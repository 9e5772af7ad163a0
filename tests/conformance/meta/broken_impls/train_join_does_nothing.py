"""Broken: `join_uneven_inputs` does nothing, as HF accelerate does on CPU (MULTI_CPU).

Rule: ``join_uneven_inputs([ddp_model], even_batches=False)`` trains to the
end when ranks have different numbers of batches. Without it the ranks with
more batches wait forever in DDP's all-reduce: ``join.uneven_inputs`` must
report HANG at world 2.
"""

import contextlib

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def join_uneven_inputs(self, joinables, even_batches=None):
    return contextlib.nullcontext()


ref.replace("accelerator.Accelerator.join_uneven_inputs", join_uneven_inputs)
ref.export(globals())
