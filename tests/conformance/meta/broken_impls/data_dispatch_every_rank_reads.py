"""Broken: a dispatching loader lets every rank read the data and cut its own share.

Rule: with ``dispatch_batches=True`` (the default for an IterableDataset)
only rank 0 iterates the underlying loader; the others receive their part
of each batch. Here every rank reads everything; the batches come out
right, so only the read counts show it. Caught at world 2 by
``data.dispatch_batches``.
"""

import itertools

from broken_impls._wrap import BrokenCopy
from torch.utils.data import DataLoader

ref = BrokenCopy(__name__)
operations = ref.module("utils.operations")


def __iter__(self):
    self.begin()
    self.set_epoch(self.iteration)
    steps = itertools.islice(self._padded_steps(DataLoader.__iter__(self)), self.skip_batches, None)
    index, count = self.state.process_index, self.state.num_processes
    for batch, real, is_last in steps:
        share = operations.find_batch_size(batch) // count
        self.end_of_dataloader = is_last
        if is_last:
            self.remainder = real
        yield self.slice_fn(batch, slice(index * share, (index + 1) * share), process_index=index, num_processes=count)
    self.iteration += 1
    self.end()


ref.replace("data_loader.DataLoaderDispatcher.__iter__", __iter__)
ref.export(globals())
