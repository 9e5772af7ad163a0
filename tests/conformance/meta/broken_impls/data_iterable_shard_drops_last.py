"""Broken: an IterableDataset shard drops the last, incomplete global batch instead of padding it.

Rule: an IterableDataset is sharded without loss; the last global batch is
completed with samples from the start (unless the loader has
``drop_last``). Caught at world 2 by ``data.iterable_dataset`` (samples no
rank saw); the loss also shows in ``data.len_after_prepare`` and
``gather_for_metrics.full_epoch`` (``len()`` still promises the padded length).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
def __iter__(self):
    size = self.total_batch_size // self.num_processes
    step = []
    for sample in self.dataset:
        step.append(sample)
        if len(step) == self.total_batch_size:
            yield from step[self.process_index * size : (self.process_index + 1) * size]
            step = []


ref.replace("_data_loader.samplers.IterableDatasetShard.__iter__", __iter__)
ref.export(globals())
