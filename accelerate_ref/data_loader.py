"""Data loaders prepared for distributed training.

`prepare_data_loader` turns a user's `torch.utils.data.DataLoader` into one
of two loaders, each a `DataLoaderAdapter` that wraps a `DataLoader` over
the same dataset (its ``base_dataloader``) and reports that one's class, so
``isinstance(loader, DataLoader)`` holds as with HF 1.15's:

* `DataLoaderShard` (the default): every process iterates its own shard,
  chosen by `_data_loader.samplers.BatchSamplerShard` (map-style datasets) or
  `_data_loader.samplers.IterableDatasetShard` (iterable ones). Before each epoch the
  random generators named in ``rng_types`` are synchronised from process 0,
  so shuffles agree and shards stay disjoint.
* `DataLoaderDispatcher` (``dispatch_batches=True``, the default for an
  `IterableDataset` when batches are put on the device): only process 0
  iterates the user's loader; it broadcasts each global batch and every
  process keeps its slice.

With ``use_stateful_dataloader`` their base loader is torchdata's
`StatefulDataLoader`, whose state they keep (`_data_loader.adapter`).
Where they are in an epoch, for a resumed run, is `DataLoaderPositionMixin`'s
(`_data_loader.position`).

While a prepared loader is iterated it is registered in `GradientState`,
with ``end_of_dataloader`` (True on its last batch) and ``remainder`` (the
number of real samples in its last global batch), which
`Accelerator.gather_for_metrics` uses to drop the samples padding added.

Catalog: every ID of "Data loading" (data.*), and gather_for_metrics.*
through `GradientState`.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ._data_loader.adapter import DataLoaderAdapter, carried_arguments, uncount_prefetched
from ._data_loader.position import DataLoaderPositionMixin
from ._data_loader.samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    batch_source,
    batching_chain,
    uneven_split,
    get_sampler,
)
from ._accelerator.parallelism import data_parallel_share
from .state import GradientState, PartialState
from .utils.dataclasses import DistributedType, RNGType
from .utils.operations import (
    broadcast,
    broadcast_object_list,
    get_data_structure,
    initialize_tensors,
    recursively_apply,
    send_to_device,
)
from .utils.random import synchronize_rng_states
from .utils._operations.samples import concatenate_samples, count_samples, slice_samples

def _total_batch_size(dataloader: DataLoader) -> Optional[int]:
    """Samples per step over all processes: a shard's global batch size, else the loader's batch size."""
    chain = list(batching_chain(dataloader))
    for node in chain:
        if isinstance(node, (BatchSamplerShard, IterableDatasetShard)):
            return node.total_batch_size
    sizes = [dataloader.batch_size] + [getattr(node, "batch_size", None) for node in chain]
    return next((size for size in sizes if size is not None), None)


def _set_epoch_everywhere(dataloader: DataLoader, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on every batch sampler, sampler and dataset of the loader that has one."""
    candidates: list[Any] = []
    for node in batching_chain(dataloader):
        candidates += [node, getattr(node, "sampler", None)]
    seen: set[int] = set()
    for candidate in candidates:
        if candidate is not None and id(candidate) not in seen and hasattr(candidate, "set_epoch"):
            seen.add(id(candidate))
            candidate.set_epoch(epoch)


class DataLoaderStateMixin:
    """What a loader tells `GradientState` while it is iterated.

    Rule: when an epoch starts the loader registers itself (`begin`) with
    ``end_of_dataloader`` False and ``remainder`` = total dataset length
    modulo total batch size (-1 when the length is unknown, the loader
    drops its last batch, or, as a `SkipDataLoader` (HF's), it has no
    ``total_batch_size``, ``total_dataset_length`` nor ``_drop_last``);
    ``end_of_dataloader`` turns True just before the last batch is
    yielded; when the epoch completes it unregisters (`end`).
    A loader left mid-epoch stays registered until it starts again (the
    documented example reads the state after ``next(iter(loader))``).
    Catalog: gather_for_metrics.doc_example, gather_for_metrics.full_epoch,
    accumulate.end_of_dataloader.
    """

    end_of_dataloader: bool = False
    remainder: int = -1

    @property
    def gradient_state(self) -> GradientState:
        """The process's `GradientState`, which this loader tells where it is (HF's attribute)."""
        return GradientState()

    def reset(self) -> None:
        """Forget the previous epoch's end-of-data state."""
        self.end_of_dataloader = False
        self.remainder = -1

    def begin(self) -> None:
        """Register with `GradientState` for a new epoch."""
        self.reset()
        self.remainder = self._remainder_at_start()
        GradientState()._add_dataloader(self)

    def _remainder_at_start(self) -> int:
        """The epoch's remainder as known when it starts (-1 where it is not)."""
        # a loader without the sizes, a dataset without a length, or batches of varying size: -1
        with contextlib.suppress(AttributeError, TypeError):
            if not self._drop_last:  # type: ignore[attr-defined]
                return _samples_in_dataset(self) % self.total_batch_size  # type: ignore[attr-defined,arg-type]
        return -1

    def end(self) -> None:
        """Unregister from `GradientState` at the end of an epoch."""
        GradientState()._remove_dataloader(self)

    def _flag_last(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Yield ``batches`` with ``end_of_dataloader`` True while the last one is out."""
        for batch, is_last in _mark_last(batches):
            self.end_of_dataloader = is_last
            if is_last:
                self._finish_state()  # type: ignore[attr-defined]
            yield batch


def _total_dataset_length(loader: DataLoader) -> int:
    """HF 1.15's ``total_dataset_length``: the dataset's ``total_length`` if it has one, else its ``len()`` (an
    `IterableDatasetShard`'s counts its padding; TypeError when there is no length)."""
    dataset = loader.dataset
    return dataset.total_length if hasattr(dataset, "total_length") else len(dataset)


def _samples_in_dataset(loader: DataLoader) -> int:
    """Samples in the whole dataset, over all processes, without padding (TypeError when it has no length)."""
    dataset = loader.dataset
    return len(dataset.dataset if isinstance(dataset, IterableDatasetShard) else dataset)


def _mark_last(items: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` for each item, looking one ahead."""
    iterator = iter(items)
    current = next(iterator, _NOTHING)
    if current is _NOTHING:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


_NOTHING = object()


class DataLoaderShard(DataLoaderPositionMixin, DataLoaderStateMixin, DataLoaderAdapter):
    """A `DataLoader` over this process's shard that places batches and keeps shuffles in sync.

    Rule, for each epoch: first the generators in ``rng_types`` take process
    0's state (``"generator"`` is ``synchronized_generator``, the sampler's or
    the iterable dataset's own), so every process shuffles identically; then
    ``set_epoch(iteration)`` reaches every sampler and dataset that takes an
    epoch; batches are moved to ``device`` (when not None), the first
    ``skip_batches`` left out; a completed epoch advances ``iteration``.
    ``len()`` is the number of batches this process yields. At one process,
    a shuffling sampler that `prepare_data_loader` gave a generator seeds it
    from torch's RNG as each epoch begins, where HF 1.15's RandomSampler
    (left without one) draws its own seed: the same seed, the same order.
    Catalog: data.shard_disjoint, data.shuffle_sync, data.device_placement,
    data.len_after_prepare, data.skip_first_batches, data.seedable_sampler,
    save_state.resume_data_order.
    """

    #: Whether each new epoch seeds the order generator from torch's RNG (see the class rules).
    _seeds_each_epoch: bool = False

    def __init__(
        self,
        dataset: Any,
        device: Optional[torch.device] = None,
        rng_types: Optional[list[Union[str, RNGType]]] = None,
        synchronized_generator: Optional[torch.Generator] = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,  # HF's signature; `prepare_data_loader` chose the shard by it
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.device = device
        self.rng_types = rng_types
        self.synchronized_generator = synchronized_generator
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.iteration = iteration

    def __iter__(self) -> Iterator[Any]:
        continuing = self._continues_started_epoch()
        if self.rng_types and not continuing:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.begin()
        self._enter_epoch()
        self.set_epoch(self.iteration)
        epoch = self._epoch_iterator(continuing)
        if self._seeds_each_epoch and not continuing:
            self._draw_epoch_seed()
        batches = itertools.islice(epoch, self.skip_batches, None)
        for batch in self._flag_last(batches):
            self._count_batch()
            yield batch if self.device is None else send_to_device(batch, self.device, non_blocking=self._non_blocking)
        self.iteration += 1
        self._leave_epoch()
        self.end()

    def __len__(self) -> int:
        """Batches this loader yields: its base loader's less the skipped ones (catalog data.len_after_prepare; HF
        1.15 leaves the skipped ones in)."""
        return max(len(self.base_dataloader) - self.skip_batches, 0)

    def adjust_state_dict_for_prefetch(self) -> None:
        """No correction: the state is taken before the batch drawn ahead (HF's rule for this loader)."""

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the current epoch of the loader and of its samplers and dataset."""
        self.iteration = epoch
        _set_epoch_everywhere(self, epoch)

    @property
    def total_batch_size(self) -> Optional[int]:
        """Samples per step over all processes (the script's batch size, times num_processes unless split)."""
        return _total_batch_size(self)

    total_dataset_length = property(_total_dataset_length)


class DataLoaderDispatcher(DataLoaderPositionMixin, DataLoaderStateMixin, DataLoaderAdapter):
    """A `DataLoader` that only process 0 iterates; each global batch is broadcast and sliced.

    Rule: process 0 takes one batch of the underlying loader per step
    (``split_batches=True``) or ``num_processes`` of them concatenated; a
    short last step is dropped with ``_drop_last``, else padded with samples
    from the start of the first step until it splits evenly; the batch's
    layout (with its non-tensor leaves), then its tensors, are broadcast from
    process 0, and process ``i`` keeps the ``i``-th of ``num_processes`` equal
    slices (``slice_fn``, default `utils._operations.samples.slice_samples`: tensors and
    lists of plain samples such as strings, which collate into lists, are
    sliced alike; HF 1.15 raises a TypeError for them). Batches land on the process's device. The
    other processes never iterate the underlying loader. The first
    ``skip_batches`` steps are dropped on process 0 (after serving as
    padding). ``remainder`` is the real size of the last step. ``len()`` is
    the number of steps.
    Catalog: data.dispatch_batches, data.iterable_dataset, data.len_after_prepare.
    """

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Optional[Callable[..., Any]] = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.split_batches = split_batches
        self.skip_batches = skip_batches
        self._drop_last = _drop_last
        self._non_blocking = _non_blocking
        self.slice_fn = slice_fn if slice_fn is not None else slice_samples
        self.torch_device_mesh = torch_device_mesh
        self.iteration = iteration
        self.state = PartialState()

    @property
    def _share(self) -> tuple[int, int]:
        """(data-parallel shares, this process's share): its own unless the mesh groups tp/cp ranks."""
        return data_parallel_share(self.torch_device_mesh, self.state.num_processes, self.state.process_index)

    @property
    def _batches_per_step(self) -> int:
        return 1 if self.split_batches else self._share[0]

    def _remainder_at_start(self) -> int:
        """-1: the remainder is the real size of the last step, set when it is dispatched (HF 1.15's)."""
        return -1

    def adjust_state_dict_for_prefetch(self) -> None:
        """When distributed, uncount the rest of the next step, which process 0 drew ahead: ``num_processes - 1``
        batches, none with ``split_batches`` (HF 1.15 uncounts ``num_processes - 1`` there too, so it resumes a
        step early)."""
        if self.state.distributed_type != DistributedType.NO:
            uncount_prefetched(self.dl_state_dict, self._batches_per_step - 1, self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        continuing = self._continues_started_epoch()
        self.begin()
        self._enter_epoch()
        self.set_epoch(self.iteration)
        source = None
        if self.state.is_main_process:  # skipped steps are dropped here, after they gave the padding
            source = itertools.islice(self._padded_steps(self._epoch_iterator(continuing)), self.skip_batches, None)
        for batch, is_last in self._received_steps(source):
            self.end_of_dataloader = is_last
            if is_last:
                self._finish_state()
            self._count_batch()
            yield batch
        self.iteration += 1
        self._leave_epoch()
        self.end()

    def _padded_steps(self, batches: Iterator[Any]) -> Iterator[tuple[Any, int, bool]]:
        """On process 0: (global batch padded to split evenly, its real size, whether it is the last)."""
        per_step = self._batches_per_step
        steps = iter(lambda: list(itertools.islice(batches, per_step)), [])
        kept = (step for step in steps if len(step) == per_step or not self._drop_last)
        first: Any = None
        for step, is_last in _mark_last(kept):
            batch = _concatenate_step(step)
            first = batch if first is None else first
            real = count_samples(batch)
            padding = math.ceil(real / self._share[0]) * self._share[0] - real
            if padding:
                batch = concatenate_samples([batch, _repeat_from_start(first, padding)])
            yield batch, real, is_last

    def _received_steps(self, source: Optional[Iterator[tuple[Any, int, bool]]]) -> Iterator[tuple[Any, bool]]:
        """On every process: (this process's slice of each global batch, whether it is the last)."""
        num_processes, index = self._share
        is_last = False
        while not is_last:
            step = self._broadcast_step(next(source, None) if source is not None else None)
            if step is None:
                return
            batch, real, is_last = step
            share = count_samples(batch) // num_processes
            mine = self.slice_fn(batch, slice(index * share, (index + 1) * share), process_index=index, num_processes=num_processes)
            if is_last:
                self.remainder = real
            yield mine, is_last

    def _broadcast_step(self, announced: Optional[tuple[Any, int, bool]]) -> Optional[tuple[Any, int, bool]]:
        """Process 0's ``announced`` step on every process (its layout first, then its tensors); None at the end."""
        header = [None if announced is None else (get_data_structure(announced[0]), announced[1], announced[2])]
        broadcast_object_list(header, from_process=0)
        if header[0] is None:
            return None
        layout, real, is_last = header[0]
        batch = announced[0] if announced is not None else initialize_tensors(layout)
        placed = send_to_device(batch, self.state.device, non_blocking=self._non_blocking)
        # plain objects (strings, ...) came with the layout; only the tensors are left to broadcast
        return recursively_apply(broadcast, placed, from_process=0), real, is_last

    def __len__(self) -> int:
        steps = super().__len__() / self._batches_per_step
        return max((math.floor(steps) if self._drop_last else math.ceil(steps)) - self.skip_batches, 0)

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the current epoch of the loader and of its samplers and dataset."""
        self.iteration = epoch
        _set_epoch_everywhere(self, epoch)

    @property
    def total_batch_size(self) -> Optional[int]:
        """Samples per step over all processes."""
        size = _total_batch_size(self)
        return None if size is None else size * self._batches_per_step

    total_dataset_length = property(_total_dataset_length)


def _concatenate_step(batches: list[Any]) -> Any:
    try:
        return concatenate_samples(batches)
    except RuntimeError as error:
        raise RuntimeError(
            "dispatch_batches=True concatenates num_processes batches per step, which needs tensors of the same "
            "shape beyond the first dimension; pass split_batches=True (one batch per step, sliced) or "
            "dispatch_batches=False (each process loads its own batches)"
        ) from error


def _repeat_from_start(batch: Any, count: int) -> Any:
    """The first ``count`` samples of ``batch``, repeated as often as needed."""
    repeats = math.ceil(count / count_samples(batch))
    return slice_samples(concatenate_samples([batch] * repeats), slice(0, count))


class SkipDataLoader(DataLoaderStateMixin, DataLoaderAdapter):
    """A plain `DataLoader` that leaves out its first ``skip_batches`` batches.

    Used by `skip_first_batches` for an unprepared loader over an iterable
    dataset, whose batches cannot be skipped by index. Like HF 1.15's, it has
    no ``total_batch_size``, ``total_dataset_length`` nor ``_drop_last``, so its
    ``remainder`` is -1 (`DataLoaderStateMixin`). With
    ``use_stateful_dataloader`` its state counts the skipped batches too (HF's)
    and is marked finished with its last batch (HF's never is).
    Catalog: data.skip_first_batches.
    """

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        yield from self._flag_last(itertools.islice(self._drawn_batches(), self.skip_batches, None))
        self.end()

    def __len__(self) -> int:
        """The base loader's batches less the skipped ones, at least 0 (catalog data.len_after_prepare)."""
        return max(len(self.base_dataloader) - self.skip_batches, 0)

    def adjust_state_dict_for_prefetch(self) -> None:
        """No correction: nothing is drawn ahead (HF 1.15 uncounts ``num_processes - 1``, resuming early)."""


# -- building prepared loaders ---------------------------------------------------


def _batch_size(dataloader: DataLoader) -> Optional[int]:
    """The batch size of the loader, or of its batch sampler (None for batches of varying size)."""
    if dataloader.batch_size is not None:
        return dataloader.batch_size
    return getattr(dataloader.batch_sampler, "batch_size", None)


def _check_split(dataloader: DataLoader, batch_size: Optional[int], num_processes: int) -> None:
    """Refuse to split batches of no known size, or whose size (above 1) ``num_processes`` does not divide (HF's
    words, which name the loader's own ``batch_size``). Catalog: data.split_batches."""
    if batch_size is None:
        raise ValueError(
            "In order to use `split_batches==True` you must have a `batch_size` attribute either in the passed "
            "`dataloader` or `dataloader.batch_sampler` objects, and it has to return a natural number. "
            "Your `dataloader.batch_size` is None and `dataloader.batch_sampler` "
            f"(`{type(dataloader.batch_sampler)}`) does not have the `batch_size` attribute set."
        )
    if batch_size > 1 and batch_size % num_processes != 0:
        raise uneven_split(dataloader.batch_size, num_processes, "a `DataLoader`")


def _sampler_of(batch_sampler: Any) -> Any:
    return getattr(batch_sampler, "sampler", None)


def _seedable(batch_sampler: Any, data_seed: Optional[int]) -> Any:
    """A copy of ``batch_sampler`` drawing from a `SeedableRandomSampler` where it had a `RandomSampler`."""
    sampler = _sampler_of(batch_sampler)
    if not isinstance(sampler, RandomSampler):
        return batch_sampler
    seedable_copy = copy.copy(batch_sampler)
    seedable_copy.sampler = SeedableRandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
        data_seed=data_seed,
    )
    return seedable_copy


def _own_generator(sampler: Any, seed_now: bool = True) -> Optional[torch.Generator]:
    """The generator ``sampler`` shuffles with, given one if it had none: seeded from torch's RNG now, or (not
    ``seed_now``) left for each epoch to seed (`DataLoaderShard`'s one-process rule)."""
    if not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        sampler.generator = torch.Generator()
        if seed_now:
            sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler.generator


def _seeds_each_epoch(sampler: Any, dataloader: DataLoader) -> bool:
    """Whether a one-process loader's shuffling stands in for the seed HF's RandomSampler (given no generator)
    draws from torch's RNG each epoch; with workers, the first indices are drawn before an epoch could seed it."""
    return isinstance(sampler, RandomSampler) and sampler.generator is None and not dataloader.num_workers


def _wants_generator(rng_types: Optional[list[Union[str, RNGType]]]) -> bool:
    return any(RNGType(rng_type) == RNGType.GENERATOR for rng_type in rng_types or [])


def prepare_data_loader(
    dataloader: DataLoader,
    device: Optional[torch.device] = None,
    num_processes: Optional[int] = None,
    process_index: Optional[int] = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Optional[list[Union[str, RNGType]]] = None,
    dispatch_batches: Optional[bool] = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Optional[Callable[..., Any]] = None,
    use_seedable_sampler: bool = False,
    data_seed: Optional[int] = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoader:
    """Wrap ``dataloader`` so that process ``process_index`` of ``num_processes`` gets its share.

    Rules (``num_processes`` / ``process_index`` default to `PartialState`'s):

    * a `DataLoaderDispatcher` when ``dispatch_batches`` (default: the
      dataset is an `IterableDataset` and ``put_on_device``; it requires
      ``put_on_device``), else a `DataLoaderShard` over a
      `BatchSamplerShard` (map-style) or an `IterableDatasetShard`;
    * per step the processes together take ``batch_size * num_processes``
      samples, or ``batch_size`` with ``split_batches`` (which must then be a
      multiple of ``num_processes``: ValueError naming both);
    * ``even_batches`` (default) pads the last step with samples from the
      start so every process gets the same number of batches; without it
      nothing is duplicated and processes may get one batch fewer;
    * ``rng_types`` are synchronised from process 0 before each epoch; for
      ``"generator"`` a shuffling sampler without one gets its own (seeded
      from torch's RNG); ``"generator"`` is removed from the caller's list
      where there is no generator to synchronise (HF 1.15's);
    * ``use_seedable_sampler`` replaces a `RandomSampler` with a
      `SeedableRandomSampler` (order = f(``data_seed`` or the torch seed, epoch));
    * batches go to ``device`` when ``put_on_device``;
    * ``use_stateful_dataloader``: torchdata's `StatefulDataLoader` underneath (ImportError without it);
    * with ``torch_device_mesh``, shares are the mesh's data-parallel ones (`_accelerator.parallelism.data_parallel_share`);
    * a map-style loader without batches (``batch_size=None`` and no batch
      sampler) is a ValueError; anything without a ``dataset`` an AttributeError (HF's).

    The user's loader is left usable. Catalog: data.shard_disjoint,
    data.effective_batch, data.split_batches, data.even_batches,
    data.uneven_batches, data.shuffle_sync, data.dispatch_batches,
    data.iterable_dataset, data.seedable_sampler, data.device_placement,
    data.len_after_prepare.
    """
    state = PartialState()
    num_processes = state.num_processes if num_processes is None else num_processes
    process_index = state.process_index if process_index is None else process_index
    num_processes, process_index = data_parallel_share(torch_device_mesh, num_processes, process_index)
    dataset = dataloader.dataset
    iterable = isinstance(dataset, IterableDataset)
    if dispatch_batches is None:
        dispatch_batches = put_on_device and iterable
    if dispatch_batches and not put_on_device:
        raise ValueError("Using `dispatch_batches=True` requires `put_on_device=True`.")  # HF's words
    batch_size = _batch_size(dataloader)
    if split_batches:
        _check_split(dataloader, batch_size, num_processes)
    batch_sampler = None if iterable else batch_source(dataloader)
    if batch_sampler is not None and use_seedable_sampler:
        batch_sampler = _seedable(batch_sampler, data_seed)
    if batch_sampler is None:  # an iterable dataset, or a loader without batches (yielding samples)
        batching = {"batch_size": batch_size, "drop_last": dataloader.drop_last}
    elif isinstance(dataloader.sampler, BatchSampler):  # kept as the sampler, as HF 1.15 keeps it
        batching = {"sampler": batch_sampler, "batch_size": dataloader.batch_size}
    else:
        batching = {"batch_sampler": batch_sampler}
    common = {"_drop_last": dataloader.drop_last, "_non_blocking": non_blocking, "use_stateful_dataloader": use_stateful_dataloader,
              **carried_arguments(dataloader)}
    if dispatch_batches:
        return _with_seedable_sampler(DataLoaderDispatcher(
            dataset, split_batches=split_batches, slice_fn=slice_fn_for_dispatch, torch_device_mesh=torch_device_mesh,
            **batching, **common))

    seeds_each_epoch = num_processes == 1 and _seeds_each_epoch(
        _sampler_of(batching.get("sampler", batching.get("batch_sampler"))), dataloader)
    dataset, batching, generator = _share_of_process(
        dataloader, batching, num_processes, process_index, split_batches, even_batches,
        own_generator=_wants_generator(rng_types) and not use_seedable_sampler, seeds_each_epoch=seeds_each_epoch,
    )
    if generator is None and rng_types is not None and "generator" in rng_types:
        rng_types.remove("generator")  # the caller's list, as HF 1.15 does
    loader = DataLoaderShard(
        dataset,
        device=device if put_on_device else None,
        rng_types=rng_types,
        synchronized_generator=generator,
        **batching,
        **common,
    )
    loader._seeds_each_epoch = seeds_each_epoch and generator is not None
    return _with_seedable_sampler(loader)


def _with_seedable_sampler(loader: Any) -> Any:
    """``loader``, its `SeedableRandomSampler` (if any) made the one `get_sampler` returns (HF 1.15's ``set_sampler``
    after preparing: a `BatchSamplerShard` shows it as its ``sampler`` too)."""
    seedable = loader._seedable_sampler()
    if seedable is not None:
        loader.set_sampler(seedable)
    return loader


def _share_of_process(
    dataloader: DataLoader,
    batching: dict[str, Any],
    num_processes: int,
    process_index: int,
    split_batches: bool,
    even_batches: bool,
    own_generator: bool,
    seeds_each_epoch: bool,
) -> tuple[Any, dict[str, Any], Optional[torch.Generator]]:
    """The dataset and batching arguments of process ``process_index``'s shard, and the generator to keep in sync.

    The generator is the iterable dataset's own, or (with ``own_generator``:
    ``"generator"`` among ``rng_types``) the shuffling sampler's, created if
    needed; None when there is none. Without ``"generator"`` a sampler keeps
    drawing from torch's RNG, which ``"torch"`` synchronises (catalog
    data.shuffle_sync; HF 1.15 gives it a generator seeded from each rank's
    own RNG when sharding, so ranks shuffle differently). On one process it
    makes the epoch resumable (catalog save_state.resume_data_order); with
    ``seeds_each_epoch`` it is left unseeded, for each epoch to seed.
    """
    key = "sampler" if "sampler" in batching else "batch_sampler"
    if num_processes == 1:
        sampler = _sampler_of(batching.get(key))
        return dataloader.dataset, batching, _own_generator(sampler, not seeds_each_epoch) if own_generator else None
    if isinstance(dataloader.dataset, IterableDataset):
        batch_size = batching["batch_size"]
        shard = IterableDatasetShard(
            dataloader.dataset, batch_size, dataloader.drop_last, num_processes, process_index, split_batches
        )
        per_process = batch_size // num_processes if split_batches else batch_size
        generator = getattr(dataloader.dataset, "generator", None)
        return shard, {**batching, "batch_size": per_process}, generator if isinstance(generator, torch.Generator) else None
    batch_sampler = batching.get(key)  # None for a loader without batches: HF 1.15's shard fails when iterated
    generator = _own_generator(_sampler_of(batch_sampler)) if own_generator else None
    shard_sampler = BatchSamplerShard(batch_sampler, num_processes, process_index, split_batches, even_batches)
    return dataloader.dataset, {**batching, key: shard_sampler} if key in batching else {key: shard_sampler}, generator


def _skipping_batches(dataloader: DataLoader, num_batches: int, prepared: bool = True) -> dict[str, Any]:
    """The batching arguments of a copy of ``dataloader`` that leaves out ``num_batches`` batches by index.

    A BatchSampler given as a prepared loader's ``sampler`` stays its ``sampler``; a plain loader's becomes the
    copy's ``batch_sampler`` (HF 1.15's)."""
    if isinstance(dataloader.dataset, IterableDataset):
        return {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
    source = batch_source(dataloader)
    skipping = SkipBatchSampler(source, num_batches) if num_batches else source
    if prepared and isinstance(dataloader.sampler, BatchSampler):
        return {"sampler": skipping, "batch_size": dataloader.batch_size}
    return {"batch_sampler": skipping}


def _continuing(dataloader: DataLoaderPositionMixin, num_batches: int, copy: DataLoaderPositionMixin) -> Any:
    """``copy``, starting ``num_batches`` into ``dataloader``'s epoch, continuing it if it is positioned."""
    copy._skipped = dataloader._skipped + num_batches
    if dataloader._keeper._positioned:
        copy._continues = dataloader._keeper
    return copy


def _seeding_as(dataloader: DataLoaderShard, copy: DataLoaderShard) -> DataLoaderShard:
    """``copy``, drawing each epoch's seed from torch's RNG where ``dataloader`` does."""
    copy._seeds_each_epoch = dataloader._seeds_each_epoch
    return copy


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader that yields what ``dataloader`` yields, from batch ``num_batches`` on.

    Rule: a prepared loader stays prepared (same device, shuffle
    synchronisation and epoch); a prepared loader restored by
    ``load_state_dict`` (`Accelerator.load_state`) or left in the middle of
    an epoch is continued: the copy replays that epoch's order and the
    loader moves on to the next epoch when the copy completes it; one
    saved in its epoch's last step was restored at the next epoch, which
    the copy begins (see `DataLoaderPositionMixin`). Where each process draws its batches from
    a batch sampler, the skipped ones are left out by index (nothing is
    loaded); over an iterable dataset, and for a dispatching loader (whose
    last step is padded from its first), they are loaded and dropped.
    ``len()`` is what remains. Anything without a ``dataset`` is an AttributeError (HF's).
    Catalog: data.skip_first_batches, save_state.resume_data_order.
    """
    dataset = dataloader.dataset
    carried = carried_arguments(dataloader)
    by_loading = num_batches if isinstance(dataset, IterableDataset) else 0
    if isinstance(dataloader, DataLoaderDispatcher):
        return _continuing(dataloader, num_batches, DataLoaderDispatcher(
            dataset,
            split_batches=dataloader.split_batches,
            skip_batches=num_batches,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            slice_fn=dataloader.slice_fn,
            torch_device_mesh=dataloader.torch_device_mesh,
            iteration=dataloader.iteration,
            **_skipping_batches(dataloader, 0),
            **carried,
        ))
    if isinstance(dataloader, DataLoaderShard):
        return _continuing(dataloader, num_batches, _seeding_as(dataloader, DataLoaderShard(
            dataset,
            device=dataloader.device,
            rng_types=dataloader.rng_types,
            synchronized_generator=dataloader.synchronized_generator,
            skip_batches=by_loading,
            _drop_last=dataloader._drop_last,
            _non_blocking=dataloader._non_blocking,
            iteration=dataloader.iteration,
            **_skipping_batches(dataloader, num_batches - by_loading),
            **carried,
        )))
    if isinstance(dataset, IterableDataset):
        return SkipDataLoader(dataset, skip_batches=by_loading, **_skipping_batches(dataloader, 0), **carried)
    return DataLoader(dataset, **_skipping_batches(dataloader, num_batches, prepared=False), **carried)


__all__ = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderDispatcher",
    "DataLoaderPositionMixin",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]
