"""Data loading on one process: sharding arithmetic, samplers, skipping, loader state, seeding.

Shards are computed for every ``process_index`` of a simulated world by
passing ``num_processes`` / ``process_index`` explicitly, which needs no
communication; the multi-rank behaviour (synchronised shuffles, dispatching)
is in ``test_data_loader_distributed.py``.
"""

from __future__ import annotations

import importlib
import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from accelerate_ref import Accelerator, AcceleratorState, GradientState, skip_first_batches
from accelerate_ref._data_loader.samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler, SkipBatchSampler
from accelerate_ref.data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    SkipDataLoader,
    prepare_data_loader,
)
from accelerate_ref.utils import RNGType, set_seed, synchronize_rng_state, synchronize_rng_states
from tests.optional import needs_torchdata
from tests.side_by_side import SevenItems, both_states, loader_comparison, loader_differences


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Stream(IterableDataset):
    """0..length-1, optionally sized."""

    def __init__(self, length: int, sized: bool = True) -> None:
        self.length, self.sized = length, sized

    def __iter__(self):
        return iter(range(self.length))

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("unsized stream")
        return self.length


def batches(length: int, batch_size: int, drop_last: bool = False) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(length)), batch_size, drop_last)


def shards(sampler, num_processes: int, **options) -> list[list[list[int]]]:
    return [list(BatchSamplerShard(sampler, num_processes, index, **options)) for index in range(num_processes)]


def start_of(length: int, count: int) -> list[int]:
    return [index % length for index in range(count)]


# -- BatchSamplerShard ---------------------------------------------------------------


def test_one_batch_per_process_in_rank_order():
    assert shards(batches(8, 2), 2) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_split_batches_gives_each_process_a_share_of_each_batch():
    assert shards(batches(8, 4), 2, split_batches=True) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_even_batches_pads_with_samples_from_the_start():
    # 10 samples, batches of 2, 3 processes: 5 batches, a 6th made of [0, 1].
    assert shards(batches(10, 2), 3) == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [0, 1]]]
    # The short last batch is completed first, then whole batches follow from the same stream.
    assert shards(batches(11, 3), 3) == [[[0, 1, 2], [9, 10, 0]], [[3, 4, 5], [1, 2, 3]], [[6, 7, 8], [4, 5, 6]]]


def test_even_batches_repeats_a_dataset_smaller_than_one_step():
    assert shards(batches(3, 2), 4) == [[[0, 1]], [[2, 0]], [[1, 2]], [[0, 1]]]


def test_uneven_batches_leave_the_last_step_short():
    assert shards(batches(10, 2), 3, even_batches=False) == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5]]]
    assert shards(batches(10, 4), 2, split_batches=True, even_batches=False) == [
        [[0, 1], [4, 5], [8, 9]],
        [[2, 3], [6, 7]],
    ]


def test_drop_last_drops_the_incomplete_step():
    assert shards(batches(11, 2, drop_last=True), 2) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_batches_of_varying_size_are_padded_with_whole_batches():
    varying = [[0], [1, 2], [3, 4, 5]]
    assert shards(varying, 2) == [[[0], [3, 4, 5]], [[1, 2], [0]]]
    assert shards(varying, 2, even_batches=False) == [[[0], [3, 4, 5]], [[1, 2]]]


#: (dataset length, batch size or share, processes, drop_last, even_batches or split_batches)
GRID = list(itertools.product([1, 2, 5, 11, 24], [1, 2, 3], [1, 2, 3, 4, 8], [False, True], [False, True]))


def test_whole_batch_shards_obey_the_rules():
    for length, batch_size, num_processes, drop_last, even in GRID:
        where = f"range({length}), batch {batch_size}, {num_processes} processes, drop_last={drop_last}, even={even}"
        sampler = batches(length, batch_size, drop_last)
        per_rank = shards(sampler, num_processes, even_batches=even)
        lengths = [len(BatchSamplerShard(sampler, num_processes, i, even_batches=even)) for i in range(num_processes)]
        assert lengths == [len(got) for got in per_rank], where
        sampler_batches = len(sampler)
        seen = Counter(sample for got in per_rank for batch in got for sample in batch)
        if drop_last:
            assert seen == Counter(range(sampler_batches // num_processes * num_processes * batch_size)), where
        elif even:
            steps = math.ceil(sampler_batches / num_processes)
            assert [len(got) for got in per_rank] == [steps] * num_processes, where
            assert all(len(batch) == batch_size for got in per_rank for batch in got), where
            padding = steps * num_processes * batch_size - length
            assert seen == Counter(range(length)) + Counter(start_of(length, padding)), where
        else:
            assert seen == Counter(range(length)), where
            expected = [len(range(i, sampler_batches, num_processes)) for i in range(num_processes)]
            assert [len(got) for got in per_rank] == expected, where


def test_split_shards_obey_the_rules():
    for length, share, num_processes, drop_last, even in GRID:
        batch_size = share * num_processes
        where = f"range({length}), batch {batch_size}, {num_processes} processes, drop_last={drop_last}, even={even}"
        sampler = batches(length, batch_size, drop_last)
        per_rank = shards(sampler, num_processes, split_batches=True, even_batches=even)
        options = {"split_batches": True, "even_batches": even}
        lengths = [len(BatchSamplerShard(sampler, num_processes, i, **options)) for i in range(num_processes)]
        assert lengths == [len(got) for got in per_rank], where
        assert all(len(batch) == share for got in per_rank for batch in got[:-1]), where
        seen = Counter(sample for got in per_rank for batch in got for sample in batch)
        if drop_last:
            assert seen == Counter(range(length // batch_size * batch_size)), where
        elif even:
            padding = math.ceil(length / batch_size) * batch_size - length
            assert seen == Counter(range(length)) + Counter(start_of(length, padding)), where
        else:
            assert seen == Counter(range(length)), where


def test_split_batch_size_must_be_a_multiple_of_the_processes():
    with pytest.raises(ValueError, match=r"batch size \(6\).*processes \(4\)"):
        BatchSamplerShard(batches(12, 6), 4, 0, split_batches=True)
    with pytest.raises(ValueError, match=r"batch size \(None\).*processes \(2\)"):  # HF 1.15's words
        BatchSamplerShard([[0], [1, 2]], 2, 0, split_batches=True)


def test_shard_reports_its_global_batch_size_and_sampler():
    sampler = batches(12, 3)
    assert BatchSamplerShard(sampler, 4, 0).total_batch_size == 12
    assert BatchSamplerShard(BatchSampler(SequentialSampler(range(12)), 4, False), 4, 0, split_batches=True).total_batch_size == 4
    assert not hasattr(BatchSamplerShard(sampler, 4, 0), "sampler")  # HF 1.15's has none until set_sampler


# -- IterableDatasetShard ------------------------------------------------------------


def stream_shards(length: int, batch_size: int, num_processes: int, **options) -> list[list[int]]:
    return [
        list(IterableDatasetShard(Stream(length), batch_size, num_processes=num_processes, process_index=i, **options))
        for i in range(num_processes)
    ]


def test_iterable_shard_slices_each_global_batch():
    assert stream_shards(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert stream_shards(8, 4, 2, split_batches=True) == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_iterable_shard_pads_from_the_start_or_drops():
    assert stream_shards(9, 2, 2) == [[0, 1, 4, 5, 8, 0], [2, 3, 6, 7, 1, 2]]
    assert stream_shards(9, 2, 2, drop_last=True) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert stream_shards(1, 2, 2) == [[0, 0], [0, 0]]


def test_iterable_shard_length_and_coverage():
    for length, share, num_processes, drop_last, split in GRID:
        where = f"range({length}), batch {share}, {num_processes} processes, drop_last={drop_last}, split={split}"
        batch_size = share * num_processes if split else share
        per_rank = stream_shards(length, batch_size, num_processes, drop_last=drop_last, split_batches=split)
        lengths = [
            len(IterableDatasetShard(Stream(length), batch_size, drop_last, num_processes, i, split))
            for i in range(num_processes)
        ]
        assert lengths == [len(got) for got in per_rank], where
        seen = Counter(itertools.chain(*per_rank))
        total = share * num_processes
        if drop_last:
            assert seen == Counter(range(length // total * total)), where
        else:
            padding = math.ceil(length / total) * total - length
            assert seen == Counter(range(length)) + Counter(start_of(length, padding)), where


def test_iterable_shard_passes_the_epoch_on_and_seeds_a_dataset_generator():
    with pytest.raises(ValueError, match=r"batch size \(3\).*processes \(2\)"):
        IterableDatasetShard(Stream(4), 3, num_processes=2, split_batches=True)
    assert list(IterableDatasetShard(Stream(4), 1, num_processes=2, split_batches=True)) == [], "HF 1.15: no refusal"
    seeded = Stream(4)
    seeded.generator = torch.Generator().manual_seed(9)
    shard = IterableDatasetShard(seeded, 2)
    shard.set_epoch(5)
    list(shard)
    assert seeded.generator.initial_seed() == 5, "a dataset without set_epoch has its generator seeded with the epoch"

    class EpochStream(Stream):
        epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

    dataset = EpochStream(4)
    shard = IterableDatasetShard(dataset, 2, num_processes=2)
    shard.set_epoch(3)
    assert (shard.epoch, dataset.epoch, shard.total_batch_size) == (3, 3, 4)


# -- SeedableRandomSampler and SkipBatchSampler ----------------------------------------


def test_seedable_sampler_order_is_a_function_of_seed_and_epoch():
    torch.manual_seed(5)
    sampler = SeedableRandomSampler(range(20))
    first, second = list(sampler), list(sampler)
    assert sorted(first) == list(range(20)) and first != second, "a full pass moves to the next epoch"
    torch.rand(100)  # other draws do not matter
    sampler.set_epoch(0)
    assert list(sampler) == first
    torch.manual_seed(5)
    assert list(SeedableRandomSampler(range(20))) == first, "same seed, same order"
    assert list(SeedableRandomSampler(range(20), data_seed=6)) != first
    torch.manual_seed(99)
    assert list(SeedableRandomSampler(range(20), data_seed=5)) == first, "data_seed overrides torch's seed"


def test_skip_batch_sampler():
    skipping = SkipBatchSampler(batches(10, 2), 3)
    assert list(skipping) == [[6, 7], [8, 9]] and len(skipping) == 2
    assert len(SkipBatchSampler(batches(10, 2), 9)) == 0  # catalog data.len_after_prepare (HF 1.15 raises)


# -- prepare_data_loader --------------------------------------------------------------


def epoch(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_prepared_loader_is_a_data_loader_of_this_process_shard():
    loaders = [prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=3, process_index=i) for i in range(3)]
    assert all(isinstance(loader, DataLoaderShard) and isinstance(loader, DataLoader) for loader in loaders)
    assert [epoch(loader) for loader in loaders] == shards(batches(10, 2), 3)
    assert [len(loader) for loader in loaders] == [2, 2, 2]
    assert (loaders[0].total_batch_size, loaders[0].total_dataset_length) == (6, 10)


def test_options_reach_the_shards():
    uneven = prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=3, process_index=2, even_batches=False)
    assert epoch(uneven) == [[4, 5]] and len(uneven) == 1
    split = prepare_data_loader(DataLoader(range(8), batch_size=4), num_processes=2, process_index=1, split_batches=True)
    assert epoch(split) == [[2, 3], [6, 7]] and split.total_batch_size == 4
    stream = prepare_data_loader(DataLoader(Stream(9), batch_size=2), num_processes=2, process_index=1)
    # total_dataset_length is the shard's padded length (HF 1.15's)
    assert epoch(stream) == [[2, 3], [6, 7], [1, 2]] and len(stream) == 3 and stream.total_dataset_length == 6
    split_stream = prepare_data_loader(DataLoader(Stream(9), batch_size=4), num_processes=2, process_index=0, split_batches=True)
    assert epoch(split_stream) == [[0, 1], [4, 5], [8, 0]] and len(split_stream) == 3


def test_user_arguments_are_carried_over():
    def collate(samples):
        return {"x": torch.tensor(samples)}

    def init_worker(worker_id):
        pass

    original = DataLoader(range(8), batch_size=2, collate_fn=collate, worker_init_fn=init_worker)
    prepared = prepare_data_loader(original, num_processes=2, process_index=0)
    assert prepared.collate_fn is collate and prepared.worker_init_fn is init_worker
    assert [b["x"].tolist() for b in prepared] == [[0, 1], [4, 5]]
    assert [b["x"].tolist() for b in original] == [[0, 1], [2, 3], [4, 5], [6, 7]], "the user's loader stays usable"


def test_seedable_sampler_replaces_the_random_sampler_on_a_copy():
    original = DataLoader(range(16), batch_size=4, shuffle=True)
    prepared = prepare_data_loader(original, num_processes=2, process_index=0, use_seedable_sampler=True, data_seed=3)
    assert isinstance(prepared.get_sampler(), SeedableRandomSampler)
    assert prepared.get_sampler() is prepared.batch_sampler.batch_sampler.sampler
    assert prepared.get_sampler().initial_seed == 3
    assert type(original.batch_sampler.sampler) is RandomSampler, "the user's batch sampler is left alone"
    first = epoch(prepared)
    prepared.set_epoch(0)
    assert epoch(prepared) == first


def test_generator_sync_only_where_there_is_a_generator():
    shuffled = prepare_data_loader(DataLoader(range(8), batch_size=2, shuffle=True), num_processes=2, process_index=0, rng_types=["generator", "torch"])
    assert shuffled.rng_types == ["generator", "torch"]
    assert shuffled.synchronized_generator is shuffled.batch_sampler.batch_sampler.sampler.generator is not None
    sequential = prepare_data_loader(DataLoader(range(8), batch_size=2), num_processes=2, process_index=0, rng_types=["generator"])
    assert sequential.rng_types == [] and sequential.synchronized_generator is None
    asked = ["generator"]
    prepare_data_loader(DataLoader(range(8), batch_size=2), rng_types=asked)
    assert asked == [], "nothing to synchronise: 'generator' leaves the caller's list (HF 1.15)"
    torch_only = prepare_data_loader(DataLoader(range(8), batch_size=2, shuffle=True), num_processes=2, process_index=0, rng_types=["torch"])
    assert torch_only.batch_sampler.batch_sampler.sampler.generator is None, (
        "without 'generator' the sampler keeps drawing from torch's RNG (catalog data.shuffle_sync)")


def test_prepare_refuses_what_it_cannot_prepare():
    with pytest.raises(AttributeError, match="'list' object has no attribute 'dataset'"):  # HF 1.15's
        prepare_data_loader([1, 2, 3])
    with pytest.raises(ValueError, match="put_on_device"):
        prepare_data_loader(DataLoader(range(4), batch_size=2), dispatch_batches=True)
    with pytest.raises(ValueError, match=r"batch size \(3\).*processes \(2\)"):
        prepare_data_loader(DataLoader(range(4), batch_size=3), num_processes=2, process_index=0, split_batches=True)
    assert list(prepare_data_loader(DataLoader(range(4), batch_size=None))) == [0, 1, 2, 3], "samples, unbatched"


def test_batches_are_placed_on_the_device_only_when_asked():
    class Placed:
        device = None

        def to(self, device, non_blocking=False):
            placed = Placed()
            placed.device = torch.device(device)
            return placed

    loader = DataLoader(range(4), batch_size=2, collate_fn=lambda samples: Placed())
    assert next(iter(prepare_data_loader(loader, device=torch.device("cpu"), put_on_device=True))).device == torch.device("cpu")
    assert next(iter(prepare_data_loader(loader, device=torch.device("cpu")))).device is None


def test_dispatcher_on_one_process():
    stream = prepare_data_loader(DataLoader(Stream(5), batch_size=2), device=torch.device("cpu"), put_on_device=True)
    assert isinstance(stream, DataLoaderDispatcher)
    assert epoch(stream) == [[0, 1], [2, 3], [4]] and len(stream) == 3
    assert stream.total_batch_size == 2 and stream.remainder == 1
    mapped = prepare_data_loader(DataLoader(range(5), batch_size=2), device=torch.device("cpu"), put_on_device=True, dispatch_batches=True)
    assert epoch(mapped) == [[0, 1], [2, 3], [4]]


def test_dispatcher_names_the_fix_for_batches_that_do_not_concatenate():
    ragged = DataLoader([torch.zeros(2), torch.zeros(3)], batch_size=1)
    loader = prepare_data_loader(ragged, device=torch.device("cpu"), put_on_device=True, dispatch_batches=True)
    loader.state.num_processes = 2  # two batches per step without launching a second process
    with pytest.raises(RuntimeError, match="split_batches=True"):
        next(iter(loader))


# -- GradientState bookkeeping ------------------------------------------------------------


def test_loader_registers_and_flags_its_last_batch():
    state = GradientState()
    loader = prepare_data_loader(DataLoader(range(9), batch_size=5), num_processes=2, process_index=1)
    assert not state.in_dataloader and state.remainder == -1
    seen = []
    for batch in loader:
        seen.append((batch.tolist(), state.active_dataloader is loader, state.end_of_dataloader, state.remainder))
    assert seen == [([5, 6, 7, 8, 0], True, True, 9)]
    assert not state.in_dataloader and not state.end_of_dataloader


def test_documented_example_reads_the_state_after_one_next():
    loader = prepare_data_loader(DataLoader(range(9), batch_size=5), num_processes=2, process_index=0)
    next(iter(loader))
    assert GradientState().end_of_dataloader and GradientState().remainder == 9


def test_nested_loaders_and_remainders():
    state = GradientState()
    outer = prepare_data_loader(DataLoader(range(4), batch_size=2))
    inner = prepare_data_loader(DataLoader(range(6), batch_size=4, drop_last=True))
    flags = []
    for _ in outer:
        for _ in inner:
            flags.append((state.active_dataloader is inner, state.remainder))
        flags.append((state.active_dataloader is outer, state.remainder, state.end_of_dataloader))
    assert flags == [(True, -1), (True, 0, False), (True, -1), (True, 0, True)]
    assert state.dataloader_references == [None]  # HF 1.15's empty list of references
    unsized = prepare_data_loader(DataLoader(Stream(3, sized=False), batch_size=2))
    assert [state.remainder for _ in unsized] == [-1, -1]


def test_a_dropped_loader_does_not_stay_registered():
    loader = prepare_data_loader(DataLoader(range(8), batch_size=2))
    next(iter(loader))
    assert GradientState().in_dataloader
    del loader
    assert not GradientState().in_dataloader


def test_epochs_advance_and_reach_samplers():
    class EpochSampler(SequentialSampler):
        epochs: list[int] = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    loader = prepare_data_loader(DataLoader(range(4), batch_size=2, sampler=EpochSampler(range(4))), num_processes=2, process_index=0)
    epoch(loader)
    epoch(loader)
    loader.set_epoch(7)
    assert EpochSampler.epochs == [0, 1, 7] and loader.iteration == 7


# -- skip_first_batches ---------------------------------------------------------------------


def test_skip_first_batches_of_every_kind_of_loader():
    plain = skip_first_batches(DataLoader(range(10), batch_size=2), num_batches=2)
    assert type(plain) is DataLoader and epoch(plain) == [[4, 5], [6, 7], [8, 9]] and len(plain) == 3
    stream = skip_first_batches(DataLoader(Stream(10), batch_size=2), num_batches=2)
    assert isinstance(stream, SkipDataLoader) and epoch(stream) == [[4, 5], [6, 7], [8, 9]] and len(stream) == 3
    shard = prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=2, process_index=1)
    skipped = skip_first_batches(shard, num_batches=1)
    assert isinstance(skipped, DataLoaderShard) and epoch(skipped) == epoch(shard)[1:] and len(skipped) == 2
    stream_shard = prepare_data_loader(DataLoader(Stream(10), batch_size=2), num_processes=2, process_index=0)
    skipped = skip_first_batches(stream_shard, num_batches=2)
    assert epoch(skipped) == epoch(stream_shard)[2:] and len(skipped) == 1
    dispatcher = prepare_data_loader(DataLoader(range(10), batch_size=2), device=torch.device("cpu"), put_on_device=True, dispatch_batches=True)
    skipped = skip_first_batches(dispatcher, num_batches=4)
    assert epoch(skipped) == [[8, 9]] and len(skipped) == 1
    too_many = skip_first_batches(DataLoader(range(10), batch_size=2), num_batches=9)
    assert epoch(too_many) == [] and len(too_many) == 0  # catalog data.len_after_prepare (HF 1.15 raises)
    with pytest.raises(AttributeError, match="'range' object has no attribute 'dataset'"):  # HF 1.15's
        skip_first_batches(range(3), 1)


def test_skipped_shuffled_loader_keeps_the_epoch_order():
    set_seed(11)
    loader = prepare_data_loader(DataLoader(range(12), batch_size=2, shuffle=True), use_seedable_sampler=True)
    epoch(loader)
    skipped = skip_first_batches(loader, num_batches=2)
    assert skipped.iteration == 1
    assert epoch(skipped) == epoch(loader)[2:]


# -- seeding and RNG synchronisation on one process -------------------------------------------


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(2).tolist()


def test_set_seed_makes_every_library_reproducible():
    set_seed(21)
    first = draws()
    set_seed(21)
    assert draws() == first
    with pytest.raises(ValueError, match="properly initialize your accelerator"):
        set_seed(21, device_specific=True)  # reads AcceleratorState().process_index, as HF 1.15 does
    AcceleratorState._reset_state(True)  # the refused AcceleratorState() is left half-built, as HF's is
    Accelerator(cpu=True)
    set_seed(21, device_specific=True)  # process 0 adds 0
    assert draws() == first
    set_seed(22)
    assert draws() != first


def test_set_seed_deterministic(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", calls.append)
    set_seed(1, deterministic=True)
    assert calls == [True]


def test_rng_synchronisation_alone_keeps_the_state():
    Accelerator(cpu=True)
    generator = torch.Generator().manual_seed(4)
    before_torch, before_generator = torch.get_rng_state(), generator.get_state()
    synchronize_rng_states(["torch", "generator"], generator)
    assert torch.equal(torch.get_rng_state(), before_torch) and torch.equal(generator.get_state(), before_generator)


def test_rng_synchronisation_refusals():
    Accelerator(cpu=True)
    with pytest.raises(AssertionError, match="Need a generator to synchronize its seed."):
        synchronize_rng_state(RNGType.GENERATOR)
    with pytest.raises(ValueError, match="dice"):
        synchronize_rng_states(["dice"])
    with pytest.raises(AssertionError, match="Can't synchronize NPU seeds on an environment without NPUs."):
        synchronize_rng_state(RNGType.NPU)
    assert synchronize_rng_state("torch") is None  # a name is no RNGType member: one process does nothing


def test_sampler_total_length_matches_hf() -> None:
    from accelerate import data_loader as hf_dl
    from torch.utils.data import BatchSampler, SequentialSampler

    from accelerate_ref import data_loader as ref_dl

    lengths = []
    for module in (ref_dl, hf_dl):
        batches = BatchSampler(SequentialSampler(range(10)), batch_size=2, drop_last=False)
        shard = module.BatchSamplerShard(batches, num_processes=2, process_index=1)
        skip = module.SkipBatchSampler(batches, skip_batches=2)
        lengths.append((shard.total_length, len(shard), skip.total_length, len(skip)))
    assert lengths[0] == lengths[1] == (5, 3, 5, 3)


@pytest.mark.parametrize("dispatch_batches", [False, True])
def test_prepared_loader_get_and_set_sampler_match_hf(dispatch_batches: bool) -> None:
    from accelerate import data_loader as hf_dl
    from torch.utils.data import DataLoader, SequentialSampler

    from accelerate_ref import data_loader as ref_dl

    class Reversed(SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    results = []
    for module, state in zip((ref_dl, hf_dl), both_states()):
        state.PartialState(cpu=True)
        loader = module.prepare_data_loader(DataLoader(list(range(6)), batch_size=2), dispatch_batches=dispatch_batches,
                                            put_on_device=True)
        before = type(loader.get_sampler()).__name__, type(module.get_sampler(loader)).__name__
        loader.set_sampler(Reversed(list(range(6))))
        results.append((before, type(loader.get_sampler()).__name__, [batch.tolist() for batch in loader]))
        state.AcceleratorState._reset_state(True)
        state.GradientState._reset_state()
    assert results[0] == results[1]
    assert results[0][1:] == ("Reversed", [[5, 4], [3, 2], [1, 0]])


@pytest.mark.parametrize("data_seed", [None, 5])
def test_seedable_random_sampler_orders_match_hf(data_seed) -> None:
    from accelerate import data_loader as hf_dl

    from accelerate_ref import data_loader as ref_dl

    orders = []
    for module in (ref_dl, hf_dl):
        torch.manual_seed(42)
        sampler = module.SeedableRandomSampler(range(8), data_seed=data_seed)
        orders.append([list(sampler), list(sampler), (sampler.set_epoch(0), list(sampler))[1]])
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1] and orders[0][0] == orders[0][2]


@pytest.mark.usefixtures('fresh_accelerate_state')
@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
def test_prepared_loaders_expose_hfs_attributes(impl: str) -> None:
    """`base_dataloader` (a plain DataLoader of the same batches), `gradient_state`, `use_stateful_dataloader`."""

    data_loader = importlib.import_module(f"{impl}.data_loader")
    importlib.import_module(impl).PartialState()
    DataLoader = torch.utils.data.DataLoader
    shard = data_loader.prepare_data_loader(DataLoader(list(range(6)), batch_size=2))
    loaders = {
        "shard": (shard, [[0, 1], [2, 3], [4, 5]]),
        "dispatcher": (data_loader.prepare_data_loader(DataLoader(SevenItems(), batch_size=3), dispatch_batches=True,
                                                                put_on_device=True),
                       [[0, 1, 2], [3, 4, 5], [6]]),
        "skipping": (data_loader.skip_first_batches(shard, 1), [[2, 3], [4, 5]]),
    }
    for name, (loader, batches) in loaders.items():
        base = loader.base_dataloader
        assert type(base) is DataLoader and base.dataset is loader.dataset, name
        assert [batch.tolist() for batch in base] == batches, name
        assert type(loader.gradient_state).__name__ == "GradientState" and loader.use_stateful_dataloader is False, name


@pytest.mark.usefixtures('fresh_accelerate_state')
@pytest.mark.parametrize("impl", ["accelerate_ref", "accelerate"])
def test_split_batches_that_do_not_divide_give_hfs_error(impl: str) -> None:

    data_loader = importlib.import_module(f"{impl}.data_loader")
    with pytest.raises(ValueError, match=r"To use a `DataLoader` in `split_batches` mode, the batch size \(3\) "
                                         r"needs to be a round multiple of the number of processes \(2\)"):
        data_loader.prepare_data_loader(torch.utils.data.DataLoader(range(12), batch_size=3), num_processes=2,
                                        process_index=0, split_batches=True, put_on_device=False)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
@needs_torchdata
def test_prepared_loaders_are_what_hfs_are_at_world_1(fresh_states) -> None:
    for stateful, seen in loader_comparison().items():
        assert loader_differences(seen["accelerate"], seen["accelerate_ref"]) == {}, f"stateful={stateful}"
        ref = seen["accelerate_ref"]
        for name in ("shard", "dispatcher", "SkipDataLoader", "DataLoaderShard", "DataLoaderDispatcher"):
            assert ref[name, "isinstance StatefulDataLoader"] is stateful and ref[name, "isinstance DataLoader"], name
            assert ref[name, "class.base_dataloader"] == (
                f"!AttributeError: type object '{ref[name, 'type']}' has no attribute 'base_dataloader'"), name
        base = "StatefulDataLoader" if stateful else "DataLoader"
        assert ref["shard", "no_such_attribute"] == f"!AttributeError: '{base}' object has no attribute 'no_such_attribute'"
        assert ref["dispatcher", "device"].startswith("!AttributeError")
        if not stateful:  # a StatefulDataLoader holds an iterator from the start, which pickles in neither
            assert ref["shard", "pickled"] == "<DataLoaderShard>" and ref["SkipDataLoader", "pickled"] == "<SkipDataLoader>"
