"""Catalog section "Data loading", and the ``gather_for_metrics.*`` rows of "Collectives".

Every rank returns what its prepared loader yielded, as plain lists of
sample indices (datasets are ``range(n)``-like, so a sample names itself).
The driver puts the ranks side by side and checks them against the rule
worked out for the whole world: shards disjoint and covering the data,
padding taken from the start of the data, as many batches on every rank,
and so on. A loader that loses, duplicates, reorders or desynchronises
samples is seen as such, whatever the implementation's own collectives say.

Options reach the loaders as the run's level spells them
(``conformance.support.spellings``): ``Accelerator`` keywords at docs-0.27,
``DataLoaderConfiguration`` (the ``Accelerator(dataloader_config=...)`` of the
1.x reference) above it.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..engine.case import ANY_WORLD, case
from ..support import spellings
from ..support.checks import expect_equal, expect_raises, expect_true, plain

DISTRIBUTED_WORLDS = tuple(w for w in ANY_WORLD if w != "1")
#: Worlds whose size divides 64 (and 32, 48): shards without padding.
POWER_OF_TWO_WORLDS = ("1", "2", "4", "2x2", "2x4")


# -- helpers run in the ranks ---------------------------------------------------


def _accelerator(impl, **dataloader_options):
    """An Accelerator whose prepared loaders use ``dataloader_options`` (split_batches, even_batches, ...), spelled
    as the run's level spells them."""
    return spellings.accelerator(impl, dataloader_options)


def _epoch(loader) -> list[list]:
    """One pass over ``loader``: each batch as a plain list."""
    return [plain(batch) for batch in loader]


class Stream(IterableDataset):
    """An iterable dataset yielding 0..length-1 that counts the samples this process produced."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.produced = 0

    def __iter__(self):
        for sample in range(self.length):
            self.produced += 1
            yield sample

    def __len__(self) -> int:
        return self.length


class CountingRange(torch.utils.data.Dataset):
    """A map-style dataset of 0..length-1 that counts the samples this process read."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.read = 0

    def __getitem__(self, index: int) -> int:
        self.read += 1
        return index

    def __len__(self) -> int:
        return self.length


# -- helpers run in the driver --------------------------------------------------


def _flat(batches: list[list]) -> list:
    return [sample for batch in batches for sample in batch]


def _start_of(length: int, count: int) -> list[int]:
    """The documented padding: ``count`` samples from the start of ``range(length)``, repeated as needed."""
    return [index % length for index in range(count)]


def _expect_even(per_rank: list[list[list]], length: int, batch_size: int, world, what: str) -> None:
    """``even_batches``: equal batch counts, full batches, the data once plus padding from its start.

    One process needs no padding: it gets the data as it is.
    """
    if world.size == 1:
        expect_equal(per_rank[0], [list(range(length))[i : i + batch_size] for i in range(0, length, batch_size)], what)
        return
    steps = math.ceil(math.ceil(length / batch_size) / world.size)
    counts = [len(batches) for batches in per_rank]
    expect_equal(counts, [steps] * world.size, f"{what}: batches per rank")
    sizes = sorted({len(batch) for batches in per_rank for batch in batches})
    expect_equal(sizes, [batch_size], f"{what}: batch sizes seen")
    seen = Counter(sample for batches in per_rank for sample in _flat(batches))
    duplicated = seen - Counter(range(length))
    expect_equal(sorted(set(range(length)) - set(seen)), [], f"{what}: samples no rank saw")
    padding = steps * world.size * batch_size - length
    expect_equal(sorted(duplicated.elements()), sorted(_start_of(length, padding)), f"{what}: duplicated samples")


def _expect_partition(per_rank: list[list], length: int, what: str) -> None:
    """Every sample of ``range(length)`` seen by exactly one rank, exactly once."""
    seen = Counter(sample for samples in per_rank for sample in samples)
    expect_equal(sorted(s for s, times in seen.items() if times > 1), [], f"{what}: samples seen more than once")
    expect_equal(sorted(set(range(length)) - set(seen)), [], f"{what}: samples no rank saw")
    expect_equal(sorted(set(seen) - set(range(length))), [], f"{what}: samples not in the dataset")


def _steps(per_rank: list[list[list]]) -> list[list]:
    """Per step, the ranks' batches concatenated in rank order (ranks must agree on the step count)."""
    counts = [len(batches) for batches in per_rank]
    expect_equal(len(set(counts)), 1, f"batches per rank {counts} should be equal")
    return [_flat([batches[step] for batches in per_rank]) for step in range(counts[0])]


# -- sharding ---------------------------------------------------------------------


def _shard_items(world) -> int:
    return max(64, 2 * world.size)


@case("data.shard_disjoint", worlds=POWER_OF_TWO_WORLDS)
def shard_disjoint(impl, world):
    """64 items on N ranks: each rank sees 64/N distinct items per epoch; together they see every item.

    (The quicktour's example: 8 processes, 64 items, 8 each.) Checked for
    a sequential loader and, after ``set_seed(0)``, a shuffled one. On a
    world of more than 32 ranks, 2 items a rank (one batch of 2 each).
    """
    acc = impl.Accelerator()
    impl.utils.set_seed(0)
    items = _shard_items(world)
    sequential = acc.prepare(DataLoader(range(items), batch_size=2))
    shuffled = acc.prepare(DataLoader(range(items), batch_size=2, shuffle=True))
    return {"sequential": _flat(_epoch(sequential)), "shuffled": [_flat(_epoch(shuffled)) for _ in range(2)]}


@shard_disjoint.check
def _shards_partition_the_data(values, world):
    items = _shard_items(world)
    per_rank = items // world.size
    for rank, value in enumerate(values):
        expect_equal(len(set(value["sequential"])), per_rank, f"rank {rank}: distinct items of the sequential loader")
    _expect_partition([v["sequential"] for v in values], items, "sequential loader")
    for epoch in range(2):
        _expect_partition([v["shuffled"][epoch] for v in values], items, f"shuffled loader, epoch {epoch}")


EFFECTIVE_BATCH = 16


def _effective_length(world) -> int:
    """384 samples (24 batches) on up to 8 ranks; more on larger worlds, so every rank gets whole batches."""
    return EFFECTIVE_BATCH * math.lcm(24, world.size)


@case("data.effective_batch")
def effective_batch(impl, world):
    """Batch size 16 on N ranks trains at 16 x N per step; the prepared length is the original's / N.

    (The quicktour's example: 16 on 4 GPUs trains at 64.)
    """
    acc = impl.Accelerator()
    original = DataLoader(range(_effective_length(world)), batch_size=EFFECTIVE_BATCH)
    prepared = acc.prepare(original)
    return {"original_len": len(original), "prepared_len": len(prepared), "batches": _epoch(prepared)}


@effective_batch.check
def _batch_times_ranks(values, world):
    steps = _steps([v["batches"] for v in values])
    expect_equal({len(step) for step in steps}, {EFFECTIVE_BATCH * world.size}, "samples per step over all ranks")
    expect_equal(sorted(_flat(steps)), list(range(_effective_length(world))), "samples of one epoch over all ranks")
    for rank, value in enumerate(values):
        expect_equal(
            value["prepared_len"], value["original_len"] // world.size, f"rank {rank}: len(prepared) = len(original) / {world.size}"
        )


def _split_batch(world) -> int:
    """24 (a multiple of every world size of ANY_WORLD), or a multiple of a larger world's size."""
    return math.lcm(24, world.size)


@case("data.split_batches")
def split_batches(impl, world):
    """``split_batches=True``: each step still takes the script's batch, 1/N of it per rank.

    The prepared loader keeps the original length; a batch size that is not
    a multiple of the number of processes is rejected with an error naming
    both numbers.
    """
    acc = _accelerator(impl, split_batches=True)
    original = DataLoader(range(5 * _split_batch(world)), batch_size=_split_batch(world))
    prepared = acc.prepare(original)
    value = {"original": _epoch(original), "prepared_len": len(prepared), "batches": _epoch(prepared)}
    if world.size > 1:
        odd = 3 * world.size + 1
        error = expect_raises(
            lambda: _epoch(acc.prepare(DataLoader(range(40), batch_size=odd))),
            ValueError,
            f"split_batches with batch size {odd} on {world.size} processes",
        )
        numbers = re.findall(r"\d+", str(error))
        expect_true(
            str(odd) in numbers and str(world.size) in numbers,
            f"the error should name the batch size {odd} and the number of processes {world.size}: {error}",
        )
    return value


@split_batches.check
def _each_rank_gets_its_share(values, world):
    original = values[0]["original"]
    expect_equal(_steps([v["batches"] for v in values]), original, "each step's shares, in rank order")
    for rank, value in enumerate(values):
        expect_equal(
            {len(batch) for batch in value["batches"]}, {_split_batch(world) // world.size}, f"rank {rank}: batch sizes"
        )
        expect_equal(value["prepared_len"], len(original), f"rank {rank}: len(prepared) with split_batches")


#: (dataset length, batch size): one that fills whole batches, one with a short last batch,
#: and one smaller than a step on most worlds.
UNEVEN_SHAPES = ((10, 2), (11, 3), (3, 2))


def _uneven_epochs(impl, **options) -> list[list[list]]:
    acc = _accelerator(impl, **options)
    return [_epoch(acc.prepare(DataLoader(range(length), batch_size=size))) for length, size in UNEVEN_SHAPES]


@case("data.even_batches")
def even_batches(impl, world):
    """``even_batches=True`` (default): samples from the start are duplicated so every rank gets as many batches."""
    return _uneven_epochs(impl)


@even_batches.check
def _padded_from_the_start(values, world):
    for shape, (length, size) in enumerate(UNEVEN_SHAPES):
        _expect_even([v[shape] for v in values], length, size, world, f"range({length}), batch_size={size}")


@case("data.uneven_batches")
def uneven_batches(impl, world):
    """``even_batches=False``: ranks may get different numbers of batches, and no sample is duplicated."""
    return _uneven_epochs(impl, even_batches=False)


@uneven_batches.check
def _nothing_duplicated(values, world):
    for shape, (length, size) in enumerate(UNEVEN_SHAPES):
        what = f"range({length}), batch_size={size}, even_batches=False"
        per_rank = [v[shape] for v in values]
        _expect_partition([_flat(batches) for batches in per_rank], length, what)
        counts = [len(batches) for batches in per_rank]
        expect_equal(sum(counts), math.ceil(length / size), f"{what}: batches over all ranks")
        expect_true(max(counts) - min(counts) <= 1, f"{what}: batches per rank {counts} differ by more than one")


# -- shuffling ----------------------------------------------------------------------


def _shuffle_length(world) -> int:
    """48 samples in batches of 2, or more on a world too large for every rank to get whole batches of them."""
    return math.lcm(48, 2 * world.size)


@case("data.shuffle_sync", worlds=DISTRIBUTED_WORLDS)
def shuffle_sync(impl, world):
    """With ``shuffle=True`` all ranks shuffle identically each epoch, so shards stay disjoint.

    Each rank seeds torch differently first, so only the synchronisation
    can make the shuffles agree. With ``rng_types=["torch", "generator"]``
    torch's global RNG is synchronised too: the first draw after an epoch
    starts is the same on every rank.
    """
    acc = _accelerator(impl)
    torch.manual_seed(1000 + world.rank)
    loader = acc.prepare(DataLoader(range(_shuffle_length(world)), batch_size=2, shuffle=True))
    epochs = [_flat(_epoch(loader)) for _ in range(2)]
    synced = impl.Accelerator(rng_types=["torch", "generator"])
    torch.manual_seed(2000 + world.rank)
    batches = iter(synced.prepare(DataLoader(range(_shuffle_length(world)), batch_size=2, shuffle=True)))
    next(batches)
    return {"epochs": epochs, "draw_after_start": torch.rand(3).tolist()}


@shuffle_sync.check
def _same_shuffle_everywhere(values, world):
    for epoch in range(2):
        _expect_partition([v["epochs"][epoch] for v in values], _shuffle_length(world), f"shuffled epoch {epoch}")
    orders = [[sample for v in values for sample in v["epochs"][epoch]] for epoch in range(2)]
    expect_true(orders[0] != orders[1], "the two epochs were shuffled the same way")
    expect_true(orders[0] != list(range(_shuffle_length(world))), "shuffle=True did not shuffle")
    draws = [v["draw_after_start"] for v in values]
    expect_equal(draws, [draws[0]] * world.size, 'torch draws after an epoch started with rng_types=["torch", ...]')


def _seedable_length(size: int) -> int:
    """32 samples in batches of 4, or more on a world too large for every rank to get whole batches of them."""
    return math.lcm(32, 4 * size)


def _seeded_run(impl, seed: int, noise: int, size: int) -> dict[str, list[list[int]]]:
    """Epochs 0 and 1 of a loader prepared with use_seedable_sampler after set_seed(seed), then replayed.

    ``noise`` other random draws happen between epochs; the replay calls
    ``set_seed(seed)`` and ``set_epoch(e)`` again on the same loader.
    """
    impl.utils.set_seed(seed)
    acc = _accelerator(impl, use_seedable_sampler=True)
    loader = acc.prepare(DataLoader(range(_seedable_length(size)), batch_size=4, shuffle=True))
    runs = {"epochs": [], "replayed": []}
    for name in runs:
        impl.utils.set_seed(seed)
        for epoch in range(2):
            loader.set_epoch(epoch)
            runs[name].append(_flat(_epoch(loader)))
            torch.rand(noise)  # the training step's own randomness must not change the data order
    return runs


@case("data.seedable_sampler", worlds=POWER_OF_TWO_WORLDS)
def seedable_sampler(impl, world):
    """``use_seedable_sampler=True`` with ``set_seed`` gives the same order on every run.

    Two runs in the same process, with different amounts of other random
    draws between epochs, yield the same batches, and so does replaying
    the same loader after ``set_seed`` and ``set_epoch``; the shards stay
    disjoint and the order is shuffled anew each epoch.
    """
    impl.Accelerator()
    runs = [_seeded_run(impl, 1234, noise, world.size) for noise in (1, 17)]
    return {"runs": runs, "other_seed": _seeded_run(impl, 4321, 1, world.size)}


@seedable_sampler.check
def _same_order_every_run(values, world):
    for rank, value in enumerate(values):
        first, second = value["runs"]
        expect_equal(first["replayed"], first["epochs"], f"rank {rank}: epochs replayed after set_seed and set_epoch")
        expect_equal(second["epochs"], first["epochs"], f"rank {rank}: the second run's epochs (same seed)")
    for epoch in range(2):
        _expect_partition([v["runs"][0]["epochs"][epoch] for v in values], _seedable_length(world.size), f"seedable sampler, epoch {epoch}")
    orders = [[sample for v in values for sample in v["runs"][0]["epochs"][epoch]] for epoch in range(2)]
    other = [sample for v in values for sample in v["other_seed"]["epochs"][0]]
    expect_true(orders[0] != list(range(_seedable_length(world.size))), "use_seedable_sampler with shuffle=True did not shuffle")
    expect_true(orders[0] != orders[1], "epochs 0 and 1 were shuffled the same way")
    expect_true(orders[0] != other, "seeds 1234 and 4321 gave the same order")


# -- iterable datasets and dispatching -------------------------------------------------


STREAM_LENGTH, STREAM_BATCH = 23, 3


@case("data.dispatch_batches", worlds=DISTRIBUTED_WORLDS)
def dispatch_batches(impl, world):
    """``dispatch_batches=True`` (default for an IterableDataset): only rank 0 reads the data.

    Rank 0 iterates the underlying loader; each step's batches are split
    and broadcast, rank r getting the r-th part. Checked for an iterable
    dataset (default) and a map-style one with ``dispatch_batches=True``;
    each dataset counts the samples read on its rank.
    """
    stream, indexed = Stream(STREAM_LENGTH), CountingRange(STREAM_LENGTH)
    default = _accelerator(impl)
    from_stream = _epoch(default.prepare(DataLoader(stream, batch_size=STREAM_BATCH)))
    dispatching = _accelerator(impl, dispatch_batches=True)
    from_indexed = _epoch(dispatching.prepare(DataLoader(indexed, batch_size=STREAM_BATCH)))
    return {"stream": from_stream, "stream_read": stream.produced, "indexed": from_indexed, "indexed_read": indexed.read}


@dispatch_batches.check
def _main_reads_and_dispatches(values, world):
    for name in ("stream", "indexed"):
        read = [v[f"{name}_read"] for v in values]
        expect_equal(read[1:], [0] * (world.size - 1), f"{name}: samples read on ranks 1..{world.size - 1}")
        expect_true(read[0] >= STREAM_LENGTH, f"{name}: rank 0 read {read[0]} samples, fewer than the {STREAM_LENGTH} there are")
        steps = _steps([v[name] for v in values])
        global_batch = STREAM_BATCH * world.size
        for index, step in enumerate(steps[:-1]):
            expect_equal(step, list(range(index * global_batch, (index + 1) * global_batch)), f"{name}: step {index}, rank by rank")
        last_start = (len(steps) - 1) * global_batch
        real = list(range(last_start, STREAM_LENGTH))
        expect_equal(steps[-1][: len(real)], real, f"{name}: last step, rank by rank")
        expect_equal(steps[-1][len(real):], _start_of(STREAM_LENGTH, len(steps[-1]) - len(real)), f"{name}: last step's padding")


@case("data.iterable_dataset")
def iterable_dataset(impl, world):
    """An IterableDataset is sharded without loss, and without duplicates beyond ``even_batches`` padding.

    Checked with each rank reading its own shard (``dispatch_batches=False``)
    and with the default (rank 0 dispatching).
    """
    sharded = _accelerator(impl, dispatch_batches=False)
    own_shards = _epoch(sharded.prepare(DataLoader(Stream(STREAM_LENGTH), batch_size=STREAM_BATCH)))
    default = _accelerator(impl)
    dispatched = _epoch(default.prepare(DataLoader(Stream(STREAM_LENGTH), batch_size=STREAM_BATCH)))
    return {"sharded": own_shards, "dispatched": dispatched}


@iterable_dataset.check
def _stream_covered_once_plus_padding(values, world):
    for name in ("sharded", "dispatched"):
        per_rank = [v[name] for v in values]
        counts = [len(batches) for batches in per_rank]
        expect_equal(len(set(counts)), 1, f"{name}: batches per rank {counts} should be equal")
        seen = Counter(sample for batches in per_rank for sample in _flat(batches))
        expect_equal(sorted(set(range(STREAM_LENGTH)) - set(seen)), [], f"{name}: samples no rank saw")
        duplicated = sorted((seen - Counter(range(STREAM_LENGTH))).elements())
        padding = sum(seen.values()) - STREAM_LENGTH
        expect_true(padding < STREAM_BATCH * world.size, f"{name}: {padding} padding samples, more than a step needs")
        expect_equal(duplicated, sorted(_start_of(STREAM_LENGTH, padding)), f"{name}: duplicated samples")


# -- skipping, placement, length ---------------------------------------------------------


SKIP_LENGTH = 40


@case("data.skip_first_batches")
def skip_first_batches(impl, world):
    """``skip_first_batches(dl, num_batches=2)`` yields the same batches as ``dl`` from the third on.

    Checked on a prepared sequential loader, a prepared shuffled one with
    ``use_seedable_sampler`` (same epoch, so the same order), a loader that
    was not prepared, a prepared iterable dataset, and last a map-style
    loader prepared with ``dispatch_batches=True``. ``len()`` of the result
    is two less.
    """
    acc = impl.Accelerator()
    impl.utils.set_seed(7)
    seedable = _accelerator(impl, use_seedable_sampler=True)
    dispatching = _accelerator(impl, dispatch_batches=True)
    loaders = {
        "prepared": acc.prepare(DataLoader(range(SKIP_LENGTH), batch_size=2)),
        "seedable shuffled": seedable.prepare(DataLoader(range(SKIP_LENGTH), batch_size=2, shuffle=True)),
        "not prepared": DataLoader(range(SKIP_LENGTH), batch_size=2),
        "iterable": acc.prepare(DataLoader(Stream(SKIP_LENGTH), batch_size=2)),
        "dispatched map-style": dispatching.prepare(DataLoader(range(SKIP_LENGTH), batch_size=2)),
    }
    for name, loader in loaders.items():
        rest = _epoch(acc.skip_first_batches(loader, num_batches=2))
        expect_equal(rest, _epoch(loader)[2:], f"{name}: skip_first_batches(dl, num_batches=2) against dl from its third batch")


class Placed:
    """A batch entry that records where ``send_to_device`` sent it (like a tensor's ``.to``)."""

    def __init__(self, device: str | None = None) -> None:
        self.device = device

    def to(self, device, non_blocking: bool = False) -> "Placed":
        return Placed(str(torch.device(device)))


def _tagged(samples: list[int]) -> dict:
    return {"x": torch.tensor(samples), "tag": Placed()}


def _first_batch(loader) -> dict:
    return next(iter(loader))


def _expect_on(device, expected: torch.device, what: str) -> None:
    """``device`` is ``expected`` (a CPU tensor reports ``cpu`` for ``cpu:0``)."""
    got = torch.device(device) if device is not None else None
    same = got is not None and got.type == expected.type and (got.index or 0) == (expected.index or 0)
    expect_true(same, f"{what}: expected {expected}, got {got}")


@case("data.device_placement")
def device_placement(impl, world):
    """Batches land on ``accelerator.device``; ``device_placement=False`` leaves them where they were.

    Each batch carries, next to its tensor, an object with a ``.to`` method
    that records the device it was sent to, so placement is visible on CPU.
    Not placing is checked through ``prepare_data_loader(dl,
    device_placement=False)`` and through ``Accelerator(device_placement=False)``.
    """
    acc = impl.Accelerator()
    placed = _first_batch(acc.prepare(DataLoader(range(16), batch_size=2, collate_fn=_tagged)))
    _expect_on(placed["x"].device, acc.device, "device of a prepared batch's tensor")
    _expect_on(placed["tag"].device, acc.device, "device a prepared batch's entries were sent to")
    stream = _first_batch(acc.prepare(DataLoader(Stream(16), batch_size=2)))
    _expect_on(stream.device, acc.device, "device of a dispatched batch (IterableDataset)")
    for how, loader in (
        ("prepare_data_loader(dl, device_placement=False)", acc.prepare_data_loader(DataLoader(range(16), batch_size=2, collate_fn=_tagged), device_placement=False)),
        ("Accelerator(device_placement=False).prepare(dl)", impl.Accelerator(device_placement=False).prepare(DataLoader(range(16), batch_size=2, collate_fn=_tagged))),
    ):
        batch = _first_batch(loader)
        expect_true(batch["tag"].device is None, f"{how}: the batch was sent to {batch['tag'].device}")


def _length_configurations(world) -> list[tuple[str, dict, object, dict]]:
    """(name, DataLoaderConfiguration options, dataset, DataLoader options) whose batch counts differ by rank or step."""
    split = 2 * world.size
    return [
        ("whole batches", {}, range(10), {"batch_size": 2}),
        ("short last batch", {}, range(11), {"batch_size": 3}),
        ("drop_last", {}, range(11), {"batch_size": 3, "drop_last": True}),
        ("shuffled", {}, range(11), {"batch_size": 3, "shuffle": True}),
        ("even_batches=False", {"even_batches": False}, range(11), {"batch_size": 3}),
        ("split_batches", {"split_batches": True}, range(5 * world.size - 1), {"batch_size": split}),
        ("iterable, sharded", {"dispatch_batches": False}, Stream(23), {"batch_size": 3}),
        ("iterable, dispatched", {}, Stream(23), {"batch_size": 3}),
        (
            "split_batches, even_batches=False",
            {"split_batches": True, "even_batches": False},
            range(5 * world.size - 1),
            {"batch_size": split},
        ),
    ]


@case("data.len_after_prepare")
def len_after_prepare(impl, world):
    """``len(prepared)`` equals the number of batches the rank then yields, in every configuration.

    Loaders made by ``skip_first_batches`` from prepared ones are prepared
    loaders too, and are checked the same way.
    """
    acc = impl.Accelerator()
    found = []
    for name, options, dataset, loader_options in _length_configurations(world):
        loader = _accelerator(impl, **options).prepare(DataLoader(dataset, **loader_options))
        yielded = len(_epoch(loader))
        found.append((name, len(loader), yielded))
        skip = min(2, yielded)
        skipped = acc.skip_first_batches(loader, num_batches=skip)
        found.append((f"{name}, skip_first_batches(dl, {skip})", len(skipped), len(_epoch(skipped))))
    return found


@len_after_prepare.check
def _length_tells_the_truth(values, world):
    wrong = [
        f"rank {rank}, {name}: len() {length}, yielded {yielded}"
        for rank, found in enumerate(values)
        for name, length, yielded in found
        if length != yielded
    ]
    expect_equal(wrong, [], "configurations where len(prepared) is not the number of batches the rank yields")


# -- gather_for_metrics ------------------------------------------------------------------


@case("gather_for_metrics.doc_example", worlds=DISTRIBUTED_WORLDS)
def gather_for_metrics_doc_example(impl, world):
    """DataLoader(range(9), batch_size=5) prepared: the first batch, gathered, has the 9 items (duplicates dropped).

    The document's world is 2; on more ranks the first step also holds all
    9 items plus padding, so the rule is the same.
    """
    acc = impl.Accelerator()
    dataloader = acc.prepare(DataLoader(range(9), batch_size=5))
    batch = next(iter(dataloader))
    gathered = acc.gather_for_metrics(batch)
    expect_equal(len(gathered), 9, "len(gather_for_metrics(first batch))")
    expect_equal(gathered, list(range(9)), "gather_for_metrics(first batch)")


TUPLE_LENGTH = 13


@case("gather_for_metrics.tuple")
def gather_for_metrics_tuple(impl, world):
    """``gather_for_metrics((predictions, targets))`` gives a tuple of gathered tensors, duplicates dropped from both."""
    acc = impl.Accelerator()
    predictions, targets = [], []
    for batch in acc.prepare(DataLoader(range(TUPLE_LENGTH), batch_size=2)):
        gathered = acc.gather_for_metrics((batch * 10, batch))
        expect_true(
            isinstance(gathered, tuple) and len(gathered) == 2 and all(isinstance(t, torch.Tensor) for t in gathered),
            f"gather_for_metrics of a (predictions, targets) tuple should be a tuple of 2 tensors, got {gathered!r}",
        )
        predictions += plain(gathered[0])
        targets += plain(gathered[1])
    return {"predictions": predictions, "targets": targets}


@gather_for_metrics_tuple.check
def _both_without_duplicates(values, world):
    for rank, value in enumerate(values):
        expect_equal(value["targets"], list(range(TUPLE_LENGTH)), f"rank {rank}: gathered targets over the epoch")
        expect_equal(value["predictions"], [10 * i for i in range(TUPLE_LENGTH)], f"rank {rank}: gathered predictions")


OBJECTS = [f"sample-{i}" for i in range(TUPLE_LENGTH)]


def _as_list(samples: list) -> list:
    return list(samples)


@case("gather_for_metrics.use_gather_object")
def gather_for_metrics_use_gather_object(impl, world):
    """``use_gather_object=True`` gathers non-tensor objects (here batches of strings), duplicates dropped."""
    acc = impl.Accelerator()
    gathered = []
    for batch in acc.prepare(DataLoader(OBJECTS, batch_size=2, collate_fn=_as_list)):
        gathered += acc.gather_for_metrics(batch, use_gather_object=True)
    return gathered


@gather_for_metrics_use_gather_object.check
def _objects_once(values, world):
    for rank, value in enumerate(values):
        expect_equal(value, OBJECTS, f"rank {rank}: strings gathered over the epoch")


FULL_EPOCH_LENGTH = 23


def _gathered_epoch(acc, loader) -> list:
    gathered = []
    for batch in loader:
        gathered += plain(acc.gather_for_metrics(batch))
    return gathered


@case("gather_for_metrics.full_epoch", worlds=("2", "3", "4", "2x2"))
def gather_for_metrics_full_epoch(impl, world):
    """Over a whole evaluation epoch the gathered outputs, concatenated, are the dataset exactly once, in order.

    Checked for a map-style loader, with ``split_batches``, and for an
    iterable dataset dispatched from rank 0 and sharded by rank.
    """
    acc = impl.Accelerator()
    setups = (
        ("map-style", acc, range(FULL_EPOCH_LENGTH), 3),
        ("split_batches", _accelerator(impl, split_batches=True), range(FULL_EPOCH_LENGTH), 2 * world.size),
        ("iterable, dispatched", acc, Stream(FULL_EPOCH_LENGTH), 3),
        ("iterable, sharded", _accelerator(impl, dispatch_batches=False), Stream(FULL_EPOCH_LENGTH), 3),
    )
    return {name: _gathered_epoch(owner, owner.prepare(DataLoader(data, batch_size=size))) for name, owner, data, size in setups}


@gather_for_metrics_full_epoch.check
def _dataset_once_in_order(values, world):
    for rank, value in enumerate(values):
        for name, gathered in value.items():
            expect_equal(gathered, list(range(FULL_EPOCH_LENGTH)), f"rank {rank}, {name}: gathered over the epoch")
