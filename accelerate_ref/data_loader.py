"""Data loaders prepared for distributed training.

`prepare_data_loader` turns a user's `torch.utils.data.DataLoader` into one
of two loaders, both real `DataLoader` subclasses:

* `DataLoaderShard` (the default): every process iterates its own shard,
  chosen by `samplers.BatchSamplerShard` (map-style datasets) or
  `samplers.IterableDatasetShard` (iterable ones). Before each epoch the
  random generators named in ``rng_types`` are synchronised from process 0,
  so shuffles agree and shards stay disjoint.
* `DataLoaderDispatcher` (``dispatch_batches=True``, the default for an
  `IterableDataset` when batches are put on the device): only process 0
  iterates the user's loader; it broadcasts each global batch and every
  process keeps its slice.

With ``use_stateful_dataloader`` both draw their batches through torchdata's
`StatefulDataLoader` and keep its state (`DataLoaderAdapter`, their base).

While a prepared loader is iterated it is registered in `GradientState`,
with ``end_of_dataloader`` (True on its last batch) and ``remainder`` (the
number of real samples in its last global batch), which
`Accelerator.gather_for_metrics` uses to drop the samples padding added.

Catalog: every ID of "Data loading" (data.*), and gather_for_metrics.*
through `GradientState`.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from .data_loader_adapter import DataLoaderAdapter, carried_arguments, uncount_prefetched
from .samplers import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    check_split_batch_size,
    get_sampler,
    set_sampler,
)
from .parallelism import data_parallel_share
from .state import GradientState, PartialState
from .utils.dataclasses import RNGType
from .utils.operations import (
    broadcast,
    broadcast_object_list,
    get_data_structure,
    initialize_tensors,
    recursively_apply,
    send_to_device,
)
from .utils.random import synchronize_rng_states
from .utils.samples import concatenate_samples, count_samples, slice_samples

def _batching_chain(dataloader: DataLoader) -> Iterator[Any]:
    """The loader's batch sampler, the batch samplers it wraps in turn, then its dataset."""
    node = dataloader.batch_sampler
    while node is not None:
        yield node
        node = getattr(node, "batch_sampler", None)
    yield dataloader.dataset


def _total_batch_size(dataloader: DataLoader) -> Optional[int]:
    """Samples per step over all processes: a shard's global batch size, else the loader's batch size."""
    chain = list(_batching_chain(dataloader))
    for node in chain:
        if isinstance(node, (BatchSamplerShard, IterableDatasetShard)):
            return node.total_batch_size
    sizes = [dataloader.batch_size] + [getattr(node, "batch_size", None) for node in chain]
    return next((size for size in sizes if size is not None), None)


def _set_epoch_everywhere(dataloader: DataLoader, epoch: int) -> None:
    """Call ``set_epoch(epoch)`` on every batch sampler, sampler and dataset of the loader that has one."""
    candidates: list[Any] = []
    for node in _batching_chain(dataloader):
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
    modulo total batch size (-1 when the length is unknown or the loader
    drops its last batch); ``end_of_dataloader`` turns True just before the
    last batch is yielded; when the epoch completes it unregisters (`end`).
    A loader left mid-epoch stays registered until it starts again (the
    documented example reads the state after ``next(iter(loader))``).
    Catalog: gather_for_metrics.doc_example, gather_for_metrics.full_epoch,
    accumulate.end_of_dataloader.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    _drop_last: bool = False

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
        if not self._drop_last:
            try:
                self.remainder = self.total_dataset_length % self.total_batch_size  # type: ignore[attr-defined]
            except TypeError:  # a dataset without a length, or batches of varying size
                self.remainder = -1
        GradientState()._add_dataloader(self)

    def end(self) -> None:
        """Unregister from `GradientState` at the end of an epoch."""
        GradientState()._remove_dataloader(self)

    @property
    def total_dataset_length(self) -> int:
        """Samples in the whole dataset, over all processes (TypeError when it has no length)."""
        dataset = self.dataset  # type: ignore[attr-defined]
        return len(dataset.dataset if isinstance(dataset, IterableDatasetShard) else dataset)

    def _flag_last(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Yield ``batches`` with ``end_of_dataloader`` True while the last one is out."""
        for batch, is_last in _mark_last(batches):
            self.end_of_dataloader = is_last
            if is_last:
                self._finish_state()  # type: ignore[attr-defined]
            yield batch


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


class _SamplerAccessMixin:
    """HF 1.15's ``get_sampler``/``set_sampler`` of the prepared loaders (see `samplers.get_sampler`)."""

    def get_sampler(self) -> Any:
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        set_sampler(self, sampler)


class DataLoaderPositionMixin(_SamplerAccessMixin):
    """Where a prepared loader is in its epoch, so that a resumed run yields what an uninterrupted one would.

    Rules (catalog save_state.resume_data_order):

    * an epoch's order is decided by the loader's order generator (the
      synchronised generator, else the sampler's or the dataset's own);
      its state when the epoch began is recorded, with the number of
      batches handed out since;
    * `state_dict` gives the epoch (``iteration``), whether it has begun,
      the batches handed out in it, the generator state its order starts
      from and a `SeedableRandomSampler`'s seed; `load_state_dict`
      restores them, and the loader is then positioned there;
    * a `skip_first_batches` copy of a positioned loader (one restored by
      `load_state_dict`, or left in the middle of an epoch) continues that
      epoch: it replays the epoch's order from its recorded start, redoes
      none of the epoch's start (no RNG synchronisation, no draw from
      torch's RNG for the iterator's base seed, both of which the
      interrupted run made before it saved), counts its batches in the
      loader's position, and when it completes the epoch the loader moves
      on to the next one. A copy of a loader that is not positioned is a
      loader of its own, as before.
    """

    iteration: int
    #: The positioned loader whose epoch this `skip_first_batches` copy continues, else None.
    _continues: Optional["DataLoaderPositionMixin"] = None
    #: Batches of the epoch this copy leaves out (where it starts in the epoch).
    _skipped: int = 0
    _epoch_started: bool = False
    _epoch_start_rng: Optional[torch.Tensor] = None
    _batches_in_epoch: int = 0
    _restored: bool = False

    @property
    def _positioned(self) -> bool:
        return self._epoch_started or self._restored

    @property
    def _keeper(self) -> "DataLoaderPositionMixin":
        """The loader that keeps the position: the one this copy continues, else itself."""
        return self._continues if self._continues is not None else self

    def _continues_started_epoch(self) -> bool:
        return self._continues is not None and self._continues._epoch_started

    def _order_generator(self) -> Optional[torch.Generator]:
        """The generator that decides the order of the loader's batches, if any."""
        candidates = [getattr(self, "synchronized_generator", None)]
        candidates += [getattr(getattr(node, "sampler", None), "generator", None) for node in _batching_chain(self)]
        candidates.append(getattr(getattr(self.dataset, "dataset", self.dataset), "generator", None))
        return next((c for c in candidates if isinstance(c, torch.Generator)), None)

    def _seedable_sampler(self) -> Optional[SeedableRandomSampler]:
        samplers = (getattr(node, "sampler", None) for node in _batching_chain(self))
        return next((s for s in samplers if isinstance(s, SeedableRandomSampler)), None)

    def _epoch_iterator(self, continuing: bool) -> Iterator[Any]:
        """The epoch's batches (`DataLoaderAdapter`), whose iterator draws a base seed from torch's RNG (not again when continuing)."""
        if not continuing:
            return self._drawn_batches()  # type: ignore[attr-defined]
        state = torch.get_rng_state()
        try:
            return self._drawn_batches()  # type: ignore[attr-defined]
        finally:
            torch.set_rng_state(state)

    def _enter_epoch(self) -> None:
        """Record the start of an epoch, or, continuing a begun one, put its order generator back to that start."""
        keeper, generator = self._keeper, self._order_generator()
        if self._continues_started_epoch():
            if generator is not None and keeper._epoch_start_rng is not None:
                generator.set_state(keeper._epoch_start_rng)
        else:
            keeper._epoch_started = True
            keeper._epoch_start_rng = generator.get_state() if generator is not None else None
        keeper._batches_in_epoch = self._skipped

    def _count_batch(self) -> None:
        self._keeper._batches_in_epoch += 1

    def _leave_epoch(self) -> None:
        """A completed epoch: the keeper moves on to the next one and holds no position anymore."""
        keeper = self._keeper
        keeper.iteration = self.iteration
        keeper._epoch_started, keeper._epoch_start_rng, keeper._batches_in_epoch, keeper._restored = False, None, 0, False

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: epoch, whether it began, batches handed out, order generator state, sampler seed.

        With ``use_stateful_dataloader``, the StatefulDataLoader's state (`DataLoaderAdapter.state_dict`).
        Catalog: save_state.resume_data_order.
        """
        if self.use_stateful_dataloader:  # type: ignore[attr-defined]
            return super().state_dict()  # type: ignore[misc]
        keeper, generator = self._keeper, self._order_generator()
        if keeper._epoch_started:
            generator_state = keeper._epoch_start_rng
        else:
            generator_state = generator.get_state() if generator is not None else None
        seedable = self._seedable_sampler()
        return {
            "iteration": keeper.iteration,
            "epoch_started": keeper._epoch_started,
            "batches_in_epoch": keeper._batches_in_epoch,
            "generator_state": generator_state,
            "sampler_seed": seedable.initial_seed if seedable is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Position the loader where `state_dict` says (see the class rules); with ``use_stateful_dataloader``, see
        `DataLoaderAdapter.load_state_dict`. Catalog: save_state.resume_data_order."""
        if self.use_stateful_dataloader:  # type: ignore[attr-defined]
            return super().load_state_dict(state_dict)  # type: ignore[misc]
        generator, seedable = self._order_generator(), self._seedable_sampler()
        if generator is not None and state_dict["generator_state"] is not None:
            generator.set_state(state_dict["generator_state"])
        if seedable is not None and state_dict["sampler_seed"] is not None:
            seedable.initial_seed = state_dict["sampler_seed"]
        self.iteration = state_dict["iteration"]
        self._epoch_started = state_dict["epoch_started"]
        self._epoch_start_rng = state_dict["generator_state"] if self._epoch_started else None
        self._batches_in_epoch = state_dict["batches_in_epoch"]
        self._restored = True


class DataLoaderShard(DataLoaderPositionMixin, DataLoaderStateMixin, DataLoaderAdapter):
    """A `DataLoader` over this process's shard that places batches and keeps shuffles in sync.

    Rule, for each epoch: first the generators in ``rng_types`` take process
    0's state (``"generator"`` is ``synchronized_generator``, the sampler's or
    the iterable dataset's own), so every process shuffles identically; then
    ``set_epoch(iteration)`` reaches every sampler and dataset that takes an
    epoch; batches are moved to ``device`` (when not None), the first
    ``skip_batches`` left out; a completed epoch advances ``iteration``.
    ``len()`` is the number of batches this process yields.
    Catalog: data.shard_disjoint, data.shuffle_sync, data.device_placement,
    data.len_after_prepare, data.skip_first_batches, data.seedable_sampler.
    """

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
        batches = itertools.islice(self._epoch_iterator(continuing), self.skip_batches, None)
        for batch in self._flag_last(batches):
            self._count_batch()
            yield batch if self.device is None else send_to_device(batch, self.device, non_blocking=self._non_blocking)
        self.iteration += 1
        self._leave_epoch()
        self.end()

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

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


class DataLoaderDispatcher(DataLoaderPositionMixin, DataLoaderStateMixin, DataLoaderAdapter):
    """A `DataLoader` that only process 0 iterates; each global batch is broadcast and sliced.

    Rule: process 0 takes one batch of the underlying loader per step
    (``split_batches=True``) or ``num_processes`` of them concatenated; a
    short last step is dropped with ``_drop_last``, else padded with samples
    from the start of the first step until it splits evenly; the batch's
    layout (with its non-tensor leaves), then its tensors, are broadcast from
    process 0, and process ``i`` keeps the ``i``-th of ``num_processes`` equal
    slices (``slice_fn``, default `utils.samples.slice_samples`: tensors and
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
        self.device = self.state.device

    @property
    def _share(self) -> tuple[int, int]:
        """(data-parallel shares, this process's share): its own unless the mesh groups tp/cp ranks."""
        return data_parallel_share(self.torch_device_mesh, self.state.num_processes, self.state.process_index)

    @property
    def _batches_per_step(self) -> int:
        return 1 if self.split_batches else self._share[0]

    def adjust_state_dict_for_prefetch(self) -> None:
        """Uncount the rest of the next step, which process 0 drew ahead: ``num_processes - 1`` batches, none with
        ``split_batches`` (HF 1.15 uncounts ``num_processes - 1`` there too, so it resumes a step early)."""
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
        placed = send_to_device(batch, self.device, non_blocking=self._non_blocking)
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
    dataset, whose batches cannot be skipped by index. With
    ``use_stateful_dataloader`` its state counts the skipped batches too (HF's)
    and is marked finished with its last batch (HF's never is).
    Catalog: data.skip_first_batches.
    """

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False, **kwargs: Any) -> None:
        super().__init__(dataset, use_stateful_dataloader=use_stateful_dataloader, **kwargs)
        self.skip_batches = skip_batches
        self._drop_last = self.drop_last

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        yield from self._flag_last(itertools.islice(super().__iter__(), self.skip_batches, None))
        self.end()

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

    def adjust_state_dict_for_prefetch(self) -> None:
        """No correction: nothing is drawn ahead (HF 1.15 uncounts ``num_processes - 1``, resuming early)."""

    @property
    def total_batch_size(self) -> Optional[int]:
        return self.batch_size


# -- building prepared loaders ---------------------------------------------------


def _batch_size(dataloader: DataLoader) -> Optional[int]:
    """The batch size of the loader, or of its batch sampler (None for batches of varying size)."""
    if dataloader.batch_size is not None:
        return dataloader.batch_size
    return getattr(dataloader.batch_sampler, "batch_size", None)


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


def _own_generator(sampler: Any) -> Optional[torch.Generator]:
    """The generator ``sampler`` shuffles with, given one (seeded from torch's RNG) if it had none."""
    if not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler.generator


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
      from torch's RNG), and it is ignored where there is none to synchronise;
    * ``use_seedable_sampler`` replaces a `RandomSampler` with a
      `SeedableRandomSampler` (order = f(``data_seed`` or the torch seed, epoch));
    * batches go to ``device`` when ``put_on_device``;
    * ``use_stateful_dataloader``: torchdata's `StatefulDataLoader` underneath (ImportError without it);
    * with ``torch_device_mesh``, shares are the mesh's data-parallel ones (`parallelism.data_parallel_share`);
    * anything but a `DataLoader` is a TypeError; a map-style loader
      without batches (``batch_size=None`` and no batch sampler) a ValueError.

    The user's loader is left usable. Catalog: data.shard_disjoint,
    data.effective_batch, data.split_batches, data.even_batches,
    data.uneven_batches, data.shuffle_sync, data.dispatch_batches,
    data.iterable_dataset, data.seedable_sampler, data.device_placement,
    data.len_after_prepare.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader takes a torch.utils.data.DataLoader, got {type(dataloader).__name__}")
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
        check_split_batch_size(batch_size, num_processes)
    if not iterable and dataloader.batch_sampler is None:
        raise ValueError("prepare_data_loader needs a batched DataLoader (a batch_size or a batch_sampler)")
    batch_sampler = None if iterable else dataloader.batch_sampler
    if batch_sampler is not None and use_seedable_sampler:
        batch_sampler = _seedable(batch_sampler, data_seed)
    batching = (
        {"batch_sampler": batch_sampler}
        if batch_sampler is not None
        else {"batch_size": batch_size, "drop_last": dataloader.drop_last}
    )
    common = {"_drop_last": dataloader.drop_last, "_non_blocking": non_blocking, "use_stateful_dataloader": use_stateful_dataloader,
              **carried_arguments(dataloader)}
    if dispatch_batches:
        return DataLoaderDispatcher(dataset, split_batches=split_batches, slice_fn=slice_fn_for_dispatch,
                                    torch_device_mesh=torch_device_mesh, **batching, **common)

    own_generator = _wants_generator(rng_types) and not use_seedable_sampler
    dataset, batching, generator = _share_of_process(
        dataloader, batching, num_processes, process_index, split_batches, even_batches, own_generator
    )
    if generator is None:
        rng_types = [rng_type for rng_type in rng_types or [] if RNGType(rng_type) != RNGType.GENERATOR]
    return DataLoaderShard(
        dataset,
        device=device if put_on_device else None,
        rng_types=list(rng_types or []),
        synchronized_generator=generator,
        **batching,
        **common,
    )


def _share_of_process(
    dataloader: DataLoader,
    batching: dict[str, Any],
    num_processes: int,
    process_index: int,
    split_batches: bool,
    even_batches: bool,
    own_generator: bool,
) -> tuple[Any, dict[str, Any], Optional[torch.Generator]]:
    """The dataset and batching arguments of process ``process_index``'s shard, and the generator to keep in sync.

    The generator is the iterable dataset's own, or (with ``own_generator``)
    the shuffling sampler's, created if needed; None when there is none.
    """
    if num_processes == 1:  # nothing to synchronise, but the order generator makes the epoch resumable
        sampler = _sampler_of(batching.get("batch_sampler"))
        return dataloader.dataset, batching, _own_generator(sampler) if own_generator else None
    if isinstance(dataloader.dataset, IterableDataset):
        batch_size = batching["batch_size"]
        shard = IterableDatasetShard(
            dataloader.dataset, batch_size, dataloader.drop_last, num_processes, process_index, split_batches
        )
        per_process = batch_size // num_processes if split_batches else batch_size
        generator = getattr(dataloader.dataset, "generator", None)
        return shard, {**batching, "batch_size": per_process}, generator if isinstance(generator, torch.Generator) else None
    batch_sampler = batching["batch_sampler"]
    generator = _own_generator(_sampler_of(batch_sampler)) if own_generator else None
    shard_sampler = BatchSamplerShard(batch_sampler, num_processes, process_index, split_batches, even_batches)
    return dataloader.dataset, {"batch_sampler": shard_sampler}, generator


def _skipping_batches(dataloader: DataLoader, num_batches: int) -> dict[str, Any]:
    """The batching arguments of a copy of ``dataloader`` that leaves out ``num_batches`` batches by index."""
    if isinstance(dataloader.dataset, IterableDataset):
        return {"batch_size": dataloader.batch_size, "drop_last": dataloader.drop_last}
    batch_sampler = dataloader.batch_sampler
    return {"batch_sampler": SkipBatchSampler(batch_sampler, num_batches) if num_batches else batch_sampler}


def _continuing(dataloader: DataLoaderPositionMixin, num_batches: int, copy: DataLoaderPositionMixin) -> Any:
    """``copy``, starting ``num_batches`` into ``dataloader``'s epoch, continuing it if it is positioned."""
    copy._skipped = dataloader._skipped + num_batches
    if dataloader._keeper._positioned:
        copy._continues = dataloader._keeper
    return copy


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader that yields what ``dataloader`` yields, from batch ``num_batches`` on.

    Rule: a prepared loader stays prepared (same device, shuffle
    synchronisation and epoch); a prepared loader restored by
    ``load_state_dict`` (`Accelerator.load_state`) or left in the middle of
    an epoch is continued: the copy replays that epoch's order and the
    loader moves on to the next epoch when the copy completes it (see
    `DataLoaderPositionMixin`). Where each process draws its batches from
    a batch sampler, the skipped ones are left out by index (nothing is
    loaded); over an iterable dataset, and for a dispatching loader (whose
    last step is padded from its first), they are loaded and dropped.
    ``len()`` is what remains. Anything but a `DataLoader` is a TypeError.
    Catalog: data.skip_first_batches, save_state.resume_data_order.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches takes a torch.utils.data.DataLoader, got {type(dataloader).__name__}")
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
        return _continuing(dataloader, num_batches, DataLoaderShard(
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
        ))
    if by_loading:
        return SkipDataLoader(dataset, skip_batches=by_loading, **_skipping_batches(dataloader, 0), **carried)
    return DataLoader(dataset, **_skipping_batches(dataloader, num_batches), **carried)


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
    "prepare_data_loader",
    "skip_first_batches",
]
