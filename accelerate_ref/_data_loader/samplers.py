"""Which samples each process gets: samplers and a dataset wrapper for sharding.

`BatchSamplerShard` shards a map-style dataset's batches,
`IterableDatasetShard` an iterable dataset's samples,
`SeedableRandomSampler` makes a shuffle a function of a seed and the epoch,
and `SkipBatchSampler` leaves out the first batches. Everything here is
local to one process: shards are disjoint only because every process
shuffles identically, which `data_loader` arranges by synchronising the
random generators before each epoch.

Padding rule shared by the shards (``even_batches``): when the data does
not fill the last global step, the missing samples are taken from the
start of the data (the first global step's samples, repeated as often as
needed), so every process gets as many batches, of full size, as the others.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler


def uneven_split(batch_size: Any, num_processes: int, splitter: str) -> ValueError:
    """The refusal of a batch that cannot be split evenly over ``num_processes``, in HF 1.15's words.

    Rule: with ``split_batches=True`` each process gets ``batch_size /
    num_processes`` samples of every batch, so the batch size must be a
    multiple of the number of processes; ``splitter`` names the class that
    splits. Catalog: data.split_batches.
    """
    return ValueError(
        f"To use {splitter} in `split_batches` mode, the batch size ({batch_size}) "
        f"needs to be a round multiple of the number of processes ({num_processes})."
    )


def take_from_start(samples: Sequence[Any], count: int) -> list[Any]:
    """The first ``count`` items of ``samples`` repeated endlessly (the ``even_batches`` padding)."""
    return list(itertools.islice(itertools.cycle(samples), count))


class SeedableRandomSampler(RandomSampler):
    """A `RandomSampler` whose order depends only on a seed and the epoch.

    Rule: epoch ``e`` is the permutation drawn from a generator seeded with
    ``initial_seed + e``; ``initial_seed`` is ``data_seed`` if given, else
    torch's initial seed (what `set_seed` set), so processes that called
    `set_seed(s)` shuffle identically without communicating, and every run
    with the same seed replays the same orders. A full pass moves to the
    next epoch; `set_epoch(e)` selects epoch ``e``.
    Catalog: data.seedable_sampler.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        data_seed: Optional[int] = kwargs.pop("data_seed", None)  # a keyword in **kwargs, as HF 1.15's signature
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next pass draws."""
        self.epoch = epoch


class BatchSamplerShard(BatchSampler):
    """The batches of ``batch_sampler`` that process ``process_index`` of ``num_processes`` takes.

    Rule, per global step (``num_processes`` consecutive batches, or one
    batch with ``split_batches``):

    * default: process ``i`` takes the ``i``-th batch of each step;
    * ``split_batches=True``: every process takes its ``1/num_processes``
      share of each batch (the batch size must be a multiple of
      ``num_processes``: `uneven_split`);
    * the last, incomplete step: dropped when the batch sampler has
      ``drop_last``; with ``even_batches`` (default) completed with samples
      from the start (see the module docstring), so all processes get the
      same number of full batches; without it left as it is, so processes
      may get one batch fewer, or a shorter one, and nothing is duplicated.

    ``len()`` is the number of batches this process yields.
    Catalog: data.shard_disjoint, data.effective_batch, data.split_batches,
    data.even_batches, data.uneven_batches, data.len_after_prepare.
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        # BatchSampler.__init__ is not called: it validates a sampler this class does not have.
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: Optional[int] = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = getattr(batch_sampler, "drop_last", False)
        if split_batches and (self.batch_size is None or self.batch_size % num_processes != 0):
            raise uneven_split(self.batch_size, num_processes, "`BatchSamplerShard`")

    @property
    def total_length(self) -> int:
        """Batches of the wrapped batch sampler, before sharding (HF 1.15)."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    @property
    def total_batch_size(self) -> Optional[int]:
        """Samples per global step over all processes (None for batches of varying size)."""
        if self.batch_size is None or self.split_batches:
            return self.batch_size
        return self.batch_size * self.num_processes

    def __iter__(self) -> Iterator[list[int]]:
        return self._split_each_batch() if self.split_batches else self._one_batch_per_process()

    def __len__(self) -> int:
        batches = len(self.batch_sampler)  # type: ignore[arg-type]
        if self.split_batches:
            return batches - self._empty_last_share(batches)
        if self.drop_last:
            return batches // self.num_processes
        if self.even_batches:
            return math.ceil(batches / self.num_processes)
        return len(range(self.process_index, batches, self.num_processes))

    def _full(self, batch: Sequence[int]) -> bool:
        return self.batch_size is None or len(batch) == self.batch_size

    def _one_batch_per_process(self) -> Iterator[list[int]]:
        step: list[Sequence[int]] = []
        first_step: list[Sequence[int]] = []
        for batch in self.batch_sampler:
            step.append(batch)
            if len(first_step) < self.num_processes:
                first_step.append(batch)
            # Only the very last batch can be short, so a short one ends the last step.
            if len(step) == self.num_processes and self._full(batch):
                yield list(step[self.process_index])
                step = []
        if not step or self.drop_last:
            return
        if self.even_batches:
            step = self._complete(step, first_step)
        if self.process_index < len(step):
            yield list(step[self.process_index])

    def _complete(self, step: list[Sequence[int]], first_step: list[Sequence[int]]) -> list[Sequence[int]]:
        """The last step filled up to ``num_processes`` full batches from the start of the data."""
        missing = self.num_processes - len(step)
        if self.batch_size is None:  # batches of varying size: repeat whole batches
            return step + take_from_start(first_step, missing)
        samples = [index for batch in first_step for index in batch]
        short = self.batch_size - len(step[-1])
        padding = take_from_start(samples, short + missing * self.batch_size)
        rest = padding[short:]
        completed = step[:-1] + [list(step[-1]) + padding[:short]]
        return completed + [rest[i * self.batch_size : (i + 1) * self.batch_size] for i in range(missing)]

    def _share(self) -> slice:
        size = self.batch_size // self.num_processes  # type: ignore[operator]
        return slice(self.process_index * size, (self.process_index + 1) * size)

    def _split_each_batch(self) -> Iterator[list[int]]:
        first: Optional[list[int]] = None
        for batch in self.batch_sampler:
            batch = list(batch)
            first = batch if first is None else first
            if len(batch) < self.batch_size:  # type: ignore[operator]
                if self.drop_last:
                    return
                if self.even_batches:
                    batch += take_from_start(first, self.batch_size - len(batch))  # type: ignore[operator]
            share = batch[self._share()]
            if share:
                yield share

    def _empty_last_share(self, batches: int) -> int:
        """1 if this process gets nothing of the short last batch (``even_batches=False``), else 0."""
        if self.even_batches or self.drop_last or batches == 0:
            return 0
        try:
            samples = len(self.batch_sampler.sampler)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):  # no sized sampler: assume full batches
            return 0
        last = samples - (batches - 1) * self.batch_size  # type: ignore[operator]
        return int(last <= self.process_index * (self.batch_size // self.num_processes))  # type: ignore[operator]


class IterableDatasetShard(IterableDataset):
    """The samples of an iterable ``dataset`` that process ``process_index`` of ``num_processes`` takes.

    Rule: the stream is cut into global batches of ``batch_size *
    num_processes`` samples (``batch_size`` with ``split_batches``, which
    must then be a multiple of ``num_processes``); process ``i`` takes the
    ``i``-th slice of each. The last, short global batch is dropped with
    ``drop_last``, else completed with samples from the start of the stream,
    so nothing is lost and only that padding is duplicated. (As documented,
    ``even_batches`` does not apply to iterable datasets.) A dataset without
    ``set_epoch`` but with a ``torch.Generator`` as ``generator`` has it
    seeded with the epoch before each pass.
    Catalog: data.iterable_dataset.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes != 0:  # a batch of 1 is not split (HF's)
            raise uneven_split(batch_size, num_processes, "`IterableDatasetShard`")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.epoch = 0

    @property
    def total_batch_size(self) -> int:
        """Samples per global step over all processes."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and pass it on to the dataset if it takes one."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Samples this process yields (needs a sized dataset)."""
        steps = len(self.dataset) / self.total_batch_size  # type: ignore[arg-type]
        return (math.floor(steps) if self.drop_last else math.ceil(steps)) * (self.total_batch_size // self.num_processes)

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if not hasattr(self.dataset, "set_epoch") and isinstance(generator, torch.Generator):
            generator.manual_seed(self.epoch)  # the epoch decides a dataset's own shuffle (HF 1.15)
        size = self.total_batch_size // self.num_processes
        mine = slice(self.process_index * size, (self.process_index + 1) * size)
        first: Optional[list[Any]] = None
        step: list[Any] = []
        for sample in self.dataset:
            step.append(sample)
            if len(step) == self.total_batch_size:
                first = step if first is None else first
                yield from step[mine]
                step = []
        if step and not self.drop_last:
            step += take_from_start(first or step, self.total_batch_size - len(step))
            yield from step[mine]


class SkipBatchSampler(BatchSampler):
    """``batch_sampler`` without its first ``skip_batches`` batches.

    Rule: yields the batches of ``batch_sampler`` from index
    ``skip_batches`` on (indices only are skipped, no sample is loaded);
    ``len()`` is what remains. Catalog: data.skip_first_batches.
    """

    def __init__(self, batch_sampler: Iterable[list[int]], skip_batches: int = 0) -> None:
        # BatchSampler.__init__ is not called: it validates a sampler this class does not have.
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches

    @property
    def total_length(self) -> int:
        """Batches of the wrapped batch sampler, skipped ones included (HF 1.15)."""
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    def __len__(self) -> int:
        """Batches left: 0 when more are skipped than there are (catalog data.len_after_prepare; HF 1.15's len()
        raises ValueError there)."""
        return max(len(self.batch_sampler) - self.skip_batches, 0)  # type: ignore[arg-type]


def batch_source(dataloader: Any) -> Any:
    """The batch sampler a loader's batches come from: its ``sampler`` where that is a BatchSampler (which HF 1.15
    accepts there), else its ``batch_sampler`` (None for a loader without batches)."""
    return dataloader.sampler if isinstance(dataloader.sampler, BatchSampler) else dataloader.batch_sampler


def get_sampler(dataloader: Any) -> Any:
    """The sampler that orders ``dataloader``'s samples (the one its batch sampler draws from).

    Rule (HF 1.15): where the loader's ``sampler`` is itself a BatchSampler,
    that one's ``sampler``; else its ``batch_sampler``'s (None if absent).
    """
    return getattr(batch_source(dataloader), "sampler", None)


def set_sampler(dataloader: Any, sampler: Any) -> None:
    """Make ``sampler`` the one `get_sampler` returns and the loader's batches are drawn from (HF 1.15's rule).

    Rule: where the loader's ``sampler`` is a BatchSampler, it is that one's
    ``sampler``; else its ``batch_sampler``'s, and the ``sampler`` of the
    batch sampler that one wraps (a `BatchSamplerShard`'s), if any.
    """
    if isinstance(dataloader.sampler, BatchSampler):
        dataloader.sampler.sampler = sampler
        return
    dataloader.batch_sampler.sampler = sampler
    if hasattr(dataloader.batch_sampler, "batch_sampler"):
        dataloader.batch_sampler.batch_sampler.sampler = sampler


def batching_chain(dataloader: DataLoader) -> Iterator[Any]:
    """The loader's batch sampler (its ``sampler`` where that is a BatchSampler, as HF 1.15 accepts), the batch
    samplers it wraps in turn, then its dataset."""
    node = batch_source(dataloader)
    while node is not None:
        yield node
        node = getattr(node, "batch_sampler", None)
    yield dataloader.dataset
