"""Probes of ``accelerate.data_loader``'s building blocks, called directly: the samplers (``SeedableRandomSampler``,
``BatchSamplerShard``, ``SkipBatchSampler``), ``IterableDatasetShard``, ``get_sampler``, and the loader classes
(``DataLoaderAdapter``, ``DataLoaderShard``, ``DataLoaderDispatcher``, ``SkipDataLoader``) built by hand, with and
without torchdata's ``StatefulDataLoader``.

``prepare_data_loader``, ``skip_first_batches`` and ``Accelerator.prepare`` of a loader are in ``data_loader_prepared``.
All of this is computed per process, so world 1 on the CPU; the sharding rules are probed with explicit
``num_processes``/``process_index``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from ..probe import Api, probe

AREA = "data_loader"


class Stream(IterableDataset):
    """0..n-1 as a stream; with ``sized`` it has a length; ``set_epoch`` calls are kept in ``epochs``."""

    def __init__(self, n: int, sized: bool = False, with_generator: bool = False) -> None:
        self.n, self.sized, self.epochs = n, sized, []
        if with_generator:
            self.generator = torch.Generator().manual_seed(7)

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("Stream has no length")
        return self.n


class EpochStream(Stream):
    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def batches(loader: Any) -> list:
    """A loader's batches as plain lists (tensors by value)."""
    return [batch.tolist() if isinstance(batch, torch.Tensor) else batch for batch in loader]


def describe_loader(loader: Any, with_len: bool = True) -> dict[str, Any]:
    """What a user sees of a (prepared) loader: its class as reported, isinstance, length, batches, dataset length.

    ``total_batch_size`` is observed apart (:func:`observe_total_batch_size`): accelerate_ref gives the documented
    global batch size where HF raises (deviations)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    seen: dict[str, Any] = {"type": type(loader).__name__, "__class__": loader.__class__.__name__,
                            "isinstance DataLoader": isinstance(loader, DataLoader),
                            "isinstance StatefulDataLoader": isinstance(loader, StatefulDataLoader)}
    reads = (("len", len),) if with_len else ()
    for name, read in reads + (("total_dataset_length", lambda x: x.total_dataset_length), ("batches", batches)):
        try:
            seen[name] = read(loader)
        except Exception as error:  # noqa: BLE001 - what it raises is what a user sees
            seen[name] = f"{type(error).__name__}: {error}"
    return seen


def _length(sized: Any) -> Any:
    """``len()``, or what it raises."""
    try:
        return len(sized)
    except Exception as error:  # noqa: BLE001 - what it raises is what a user sees
        return f"{type(error).__name__}: {error}"


def _items(sampler: Any) -> tuple:
    """The items of a sampler or dataset shard and its ``total_length`` if any."""
    return list(iter(sampler)), getattr(sampler, "total_length", None)  # iter: list() would ask len() first


#: The label under which a probe records the ``total_batch_size`` of its dispatchers, skipped and stream loaders
#: together: accelerate_ref gives the documented global batch size where HF 1.15 raises or gives a per-process one
#: (DIFFERENTIAL.toml).
DOCUMENTED_SIZES = "total_batch_size of the dispatching, skipping and stream loaders"


def observe_total_batch_size(api: Api, label: str, loader: Any, documented: dict[str, Any] | None = None) -> None:
    """Observe ``loader.total_batch_size`` under ``label``; or, given ``documented``, keep it there to be recorded
    once under :data:`DOCUMENTED_SIZES`."""
    if documented is None:
        api.observe(f"{label}: total_batch_size", lambda: loader.total_batch_size)
        return
    try:
        documented[label] = loader.total_batch_size
    except Exception as error:  # noqa: BLE001 - what it raises is what a user sees
        documented[label] = f"{type(error).__name__}: {error}"


def _batch_sampler(n: int, size: int, drop_last: bool = False) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(n)), size, drop_last)


@probe(AREA)
def seedable_random_sampler(api: Api) -> None:
    path = "data_loader.SeedableRandomSampler"
    sampler = api.call("with data_seed", path, list(range(6)), data_seed=3)
    api.observe("initial_seed and epoch", lambda: (sampler.initial_seed, sampler.epoch))
    api.observe("a pass", list, sampler)
    api.observe("epoch after a pass", lambda: sampler.epoch)
    api.observe("the next pass", list, sampler)
    api.observe("set_epoch", sampler.set_epoch, 0)
    api.observe("a pass after set_epoch(0)", list, sampler)
    api.observe("a pass left after one sample", lambda: (next(iter(sampler)), sampler.epoch))
    torch.manual_seed(5)
    default = api.call("without data_seed", path, list(range(5)))
    api.observe("initial_seed from torch", lambda: default.initial_seed)
    api.observe("its pass", list, default)
    given = api.call("a generator, replacement, num_samples", path, list(range(4)),
                     generator=torch.Generator().manual_seed(1), num_samples=3, replacement=True, data_seed=2)
    api.observe("its pass #2", list, given)
    api.call("num_samples 0", path, list(range(4)), num_samples=0)
    api.call("replacement not a bool", path, list(range(4)), replacement=1)
    api.call("an unknown keyword", path, list(range(4)), seed=1)


class _CustomBatches:
    """A user's batch sampler: fixed batches and a ``batch_size``, but no ``sampler`` to count samples by."""

    def __init__(self, batches: list[list[int]], batch_size: int) -> None:
        self.batches, self.batch_size = batches, batch_size

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@probe(AREA)
def batch_sampler_shard(api: Api) -> None:
    path = "data_loader.BatchSamplerShard"
    lengths: dict[bool, dict[str, Any]] = {False: {}, True: {}}
    for n, size in ((10, 3), (8, 2), (3, 2), (2, 4), (0, 2)):
        for drop_last in (False, True):
            for split, even in ((False, True), (False, False), (True, True), (True, False)):
                if split and size % 2:
                    continue
                for index in (0, 1):
                    label = f"n={n} size={size} drop_last={drop_last} split={split} even={even} rank {index}"
                    make = lambda: api.get(path)(_batch_sampler(n, size, drop_last), 2, index, split, even)  # noqa: E731
                    api.observe(label, lambda: _items(make()))
                    lengths[split][label] = _length(make())
    api.record("len of each", lengths[False])
    api.record("len of each with split_batches", lengths[True])
    shard = api.call("defaults", path, _batch_sampler(5, 2))
    api.observe("defaults: attributes", lambda: (shard.num_processes, shard.process_index, shard.split_batches,
                                                 shard.even_batches, shard.batch_size, shard.drop_last,
                                                 len(shard), list(shard)))
    varying = [[0, 1], [2], [3, 4, 5]]
    for even in (True, False):
        for index in (0, 1):
            shard = api.get(path)(varying, 2, index, even_batches=even)
            api.observe(f"batches of varying size, even={even} rank {index}",
                        lambda: (shard.batch_size, len(shard), list(shard)))
    unsized = _CustomBatches([[0, 1], [2, 3], [4]], batch_size=2)
    for index in (0, 1):
        shard = api.get(path)(unsized, 2, index, split_batches=True, even_batches=False)
        api.observe(f"split, uneven, a batch sampler without a sampler, rank {index}", lambda: (len(shard), list(shard)))
    api.call("split_batches, a size not a multiple", path, _batch_sampler(6, 3), 2, 0, True)
    api.call("split_batches without a batch size", path, varying, 2, 0, True)


@probe(AREA)
def iterable_dataset_shard(api: Api) -> None:
    path = "data_loader.IterableDatasetShard"
    lengths: dict[bool, dict[str, Any]] = {False: {}, True: {}}
    for n in (10, 3, 0):
        for size in (1, 2, 4):
            for drop_last in (False, True):
                for split in (False, True):
                    for index in (0, 1):
                        label = f"n={n} size={size} drop_last={drop_last} split={split} rank {index}"
                        make = lambda: api.get(path)(Stream(n, sized=True), size, drop_last, 2, index, split)  # noqa: E731
                        api.observe(label, lambda: _items(make()))
                        lengths[split][label] = _length(make())
    api.record("len of each", lengths[False])
    api.record("len of each with split_batches", lengths[True])
    shard = api.call("defaults", path, Stream(3))
    api.observe("defaults: attributes", lambda: (shard.batch_size, shard.drop_last, shard.num_processes,
                                                 shard.process_index, shard.split_batches, list(shard)))
    api.observe("len of an unsized stream", len, shard)
    epochs = EpochStream(4)
    shard = api.get(path)(epochs, 2)
    api.observe("set_epoch reaches the dataset", lambda: (shard.set_epoch(3), shard.epoch, epochs.epochs))
    api.observe("set_epoch on a dataset without one", lambda: api.get(path)(Stream(2)).set_epoch(1))
    seeded = api.get(path)(Stream(3, with_generator=True), 2)
    api.observe("a dataset with a generator, no epoch set", lambda: (list(seeded), seeded.dataset.generator.initial_seed()))
    seeded.set_epoch(4)
    api.observe("a dataset with a generator after set_epoch", lambda: (list(seeded), seeded.dataset.generator.initial_seed()))
    api.call("split_batches, a size not a multiple", path, Stream(4), 3, False, 2, 0, True)
    api.call("split_batches, batch_size 1 of 2", path, Stream(4), 1, False, 2, 0, True)
    api.call("batch_size None", path, Stream(4), None)


@probe(AREA)
def skip_batch_sampler(api: Api) -> None:
    path = "data_loader.SkipBatchSampler"
    for skip in (0, 2, 9):
        api.observe(f"skip {skip}", lambda: _items(api.get(path)(_batch_sampler(7, 2), skip)))
        if skip < 9:
            api.observe(f"skip {skip}: len", len, api.get(path)(_batch_sampler(7, 2), skip))
    api.observe("len after skipping more batches than there are", len, api.get(path)(_batch_sampler(7, 2), 9))
    sampler = api.call("defaults", path, [[0], [1, 2]])
    api.observe("defaults: a list of batches", lambda: (len(sampler), list(sampler), sampler.total_length))
    api.observe("its sampler", getattr, sampler, "sampler")
    api.observe("its batch_size", getattr, sampler, "batch_size")


@probe(AREA)
def get_sampler(api: Api) -> None:
    path = "data_loader.get_sampler"
    api.call("a sequential loader", path, DataLoader(list(range(4)), batch_size=2))
    api.call("a shuffling loader", path, DataLoader(list(range(4)), batch_size=2, shuffle=True))
    api.call("a BatchSampler as sampler", path, DataLoader(list(range(4)), sampler=_batch_sampler(4, 2),
                                                           batch_size=None))
    api.call("a list as batch_sampler", path, DataLoader(list(range(4)), batch_sampler=[[0, 1], [2, 3]]))
    api.call("an iterable loader", path, DataLoader(Stream(4), batch_size=2))
    api.call("not a loader", path, [1, 2])


def outcome(call: Any) -> Any:
    """What ``call()`` returned, or what it raised, as text."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - what it raises is what a user sees
        return f"{type(error).__name__}: {error}"


def _state_members(loader: Any) -> dict[str, Any]:
    """state_dict, adjust_state_dict_for_prefetch, state_dict again, load_state_dict({}): each one's outcome."""
    return {"state_dict": outcome(loader.state_dict),
            "adjust_state_dict_for_prefetch": outcome(loader.adjust_state_dict_for_prefetch),
            "state_dict after the adjustment": outcome(loader.state_dict),
            "load_state_dict of nothing": outcome(lambda: loader.load_state_dict({}))}


def _adapter_views(api: Api, label: str, loader: Any, documented: dict[str, Any] | None = None) -> None:
    """What the state members of a loader class do (DataLoaderAdapter's and DataLoaderStateMixin's).

    Without ``use_stateful_dataloader`` the state members are recorded under one label: accelerate_ref keeps a
    position there where HF 1.15 raises (DIFFERENTIAL.toml)."""
    api.observe(f"{label}: describe", describe_loader, loader)
    observe_total_batch_size(api, label, loader, documented)
    if loader.use_stateful_dataloader:
        api.observe(f"{label}: state_dict", loader.state_dict)
        api.observe(f"{label}: adjust_state_dict_for_prefetch", loader.adjust_state_dict_for_prefetch)
        api.observe(f"{label}: state_dict after the adjustment", loader.state_dict)
    else:
        api.observe(f"{label}: state members", _state_members, loader)
    api.observe(f"{label}: end_of_dataloader, remainder", lambda: (loader.end_of_dataloader, loader.remainder))
    api.observe(f"{label}: reset", lambda: (loader.reset(), loader.end_of_dataloader, loader.remainder))
    api.observe(f"{label}: an attribute it lacks", getattr, loader, "no_such_attribute")
    if loader.use_stateful_dataloader:
        api.observe(f"{label}: load_state_dict of nothing", loader.load_state_dict, {})


@probe(AREA)
def data_loader_adapter(api: Api) -> None:
    path = "data_loader.DataLoaderAdapter"
    for stateful in (False, True):
        adapter = api.call(f"stateful={stateful}", path, list(range(5)), use_stateful_dataloader=stateful, batch_size=2)
        api.observe(f"stateful={stateful}: __class__, len", lambda: (adapter.__class__.__name__, len(adapter)))
        api.observe(f"stateful={stateful}: base_dataloader", lambda: type(adapter.base_dataloader).__name__)
        api.observe(f"stateful={stateful}: batches of its base", lambda: batches(adapter.base_dataloader))
        api.observe(f"stateful={stateful}: iter", lambda: batches(adapter))
        api.observe(f"stateful={stateful}: state_dict", adapter.state_dict)
        api.observe(f"stateful={stateful}: adjust_state_dict_for_prefetch", adapter.adjust_state_dict_for_prefetch)
        api.observe(f"stateful={stateful}: an attribute it lacks", getattr, adapter, "no_such_attribute")
    api.call("a batch_sampler", path, list(range(5)), batch_sampler=[[4, 3], [1]])
    api.call("an unknown keyword", path, list(range(5)), no_such_keyword=1)
    api.call("shuffle with a sampler", path, list(range(5)), shuffle=True, sampler=SequentialSampler(range(5)))


@probe(AREA)
def data_loader_shard(api: Api) -> None:
    path = "data_loader.DataLoaderShard"
    for stateful in (False, True):
        label = f"stateful={stateful}"
        loader = api.call(label, path, list(range(7)), use_stateful_dataloader=stateful, batch_size=2)
        api.observe(f"{label}: attributes", lambda: (loader.device, loader.rng_types, loader.synchronized_generator,
                                                     loader.skip_batches, loader._drop_last, loader.iteration))
        _adapter_views(api, label, loader)
        api.observe(f"{label}: iteration after an epoch", lambda: loader.iteration)
        api.observe(f"{label}: get_sampler", loader.get_sampler)
        api.observe(f"{label}: set_sampler", loader.set_sampler, SequentialSampler(range(3)))
        api.observe(f"{label}: batches after set_sampler", batches, loader)
        api.observe(f"{label}: set_epoch", lambda: (loader.set_epoch(5), loader.iteration))
        it = iter(loader)
        api.observe(f"{label}: first batch, end_of_dataloader", lambda: (next(it).tolist(), loader.end_of_dataloader))
        if stateful:
            api.observe(f"{label}: state_dict mid-epoch", loader.state_dict)
        api.observe(f"{label}: last batch, end_of_dataloader", lambda: (next(it).tolist(), loader.end_of_dataloader))
        if stateful:
            api.observe(f"{label}: state_dict at the end", loader.state_dict)
    skipping = api.call("skip_batches, device, rng_types", path, list(range(6)), device=torch.device("cpu"),
                        rng_types=["torch"], skip_batches=1, batch_size=2, drop_last=True)
    api.observe("skip_batches: describe", describe_loader, skipping)
    by_sampler = api.call("a BatchSampler as sampler", path, torch.arange(6), sampler=_batch_sampler(6, 3),
                          batch_size=None)
    api.observe("a BatchSampler as sampler: describe", describe_loader, by_sampler)
    api.observe("a BatchSampler as sampler: get_sampler", by_sampler.get_sampler)
    api.observe("a BatchSampler as sampler: set_sampler", by_sampler.set_sampler, SequentialSampler(range(2)))
    api.observe("a BatchSampler as sampler: batches after set_sampler", batches, by_sampler)
    epochs = EpochStream(4)
    stream = api.call("a stream with set_epoch", path, epochs, batch_size=3)
    api.observe("a stream with set_epoch: describe", describe_loader, stream)
    api.observe("a stream with set_epoch: set_epoch", lambda: (stream.set_epoch(2), epochs.epochs))
    api.call("an unknown keyword", path, list(range(5)), no_such_keyword=1)


@probe(AREA)
def data_loader_dispatcher(api: Api) -> None:
    path = "data_loader.DataLoaderDispatcher"
    api.partial_state()
    documented: dict[str, Any] = {}
    for stateful in (False, True):
        label = f"stateful={stateful}"
        loader = api.call(label, path, list(range(7)), use_stateful_dataloader=stateful, batch_size=2)
        api.observe(f"{label}: attributes", lambda: (loader.split_batches, loader.skip_batches, loader._drop_last,
                                                     loader.iteration, loader.torch_device_mesh))
        api.observe(f"{label}: the default slice_fn", lambda: loader.slice_fn)
        _adapter_views(api, label, loader, documented)
        api.observe(f"{label}: get_sampler", loader.get_sampler)
        api.observe(f"{label}: set_sampler", loader.set_sampler, SequentialSampler(range(3)))
        api.observe(f"{label}: batches after set_sampler", batches, loader)
        api.observe(f"{label}: set_epoch", lambda: (loader.set_epoch(5), loader.iteration))
    api.record(DOCUMENTED_SIZES, documented)
    split = api.call("split_batches, skip_batches, drop_last", path, list(range(7)), split_batches=True,
                     skip_batches=1, _drop_last=True, batch_size=2, drop_last=True)
    api.observe("split_batches: describe", describe_loader, split)
    stream = api.call("a stream", path, Stream(5), batch_size=2)
    api.observe("a stream: describe", describe_loader, stream)
    api.observe("a stream: remainder", lambda: stream.remainder)
    sliced = api.call("a slice_fn", path, list(range(4)), batch_size=2,
                      slice_fn=lambda batch, index, process_index, num_processes: batch[index] * 10)
    api.observe("a slice_fn: batches", batches, sliced)
    ragged = api.call("batches of varying shape", path, [torch.zeros(1), torch.zeros(2)], batch_size=1)
    api.observe("batches of varying shape: batches", batches, ragged)
    api.call("an unknown keyword", path, list(range(5)), no_such_keyword=1)


@probe(AREA)
def skip_data_loader(api: Api) -> None:
    path = "data_loader.SkipDataLoader"
    for stateful in (False, True):
        label = f"stateful={stateful}"
        loader = api.call(label, path, list(range(7)), skip_batches=1, use_stateful_dataloader=stateful,
                          batch_size=2)
        api.observe(f"{label}: skip_batches", lambda: loader.skip_batches)
        _adapter_views(api, label, loader)
    default = api.call("defaults", path, Stream(5), batch_size=2)
    api.observe("defaults: describe", describe_loader, default)
    api.call("an unknown keyword", path, list(range(5)), no_such_keyword=1)
