"""Data loading across ranks, through the simulator at worlds 2, 3, 4 and 2x2.

One launch per world: every rank runs `rank_report`, which exercises
shuffle synchronisation, RNG synchronisation, seeding, dispatching,
skipping, lengths and the gather-and-trim that `gather_for_metrics` relies
on, and returns plain data; the tests compare the ranks in the driver.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import simulators
from tests.optional import needs_torchdata
from tests.side_by_side import RANK_ENV, loader_comparison, loader_differences

WORLDS = [(2, 1), (3, 1), (4, 1), (4, 2)]
STREAM, BATCH = 23, 3


class WordStream(IterableDataset):
    """Dict samples with a string field: default_collate makes each batch's "text" a list of strings. The text
    comes first, so a batch's size is read from a list of strings, not from the tensor beside it."""

    def __iter__(self):
        for sample in range(STREAM):
            yield {"text": f"w{sample}", "id": sample}


class CountingStream(IterableDataset):
    """0..length-1; counts the samples produced on this rank."""

    def __init__(self, length: int) -> None:
        self.length, self.produced = length, 0

    def __iter__(self):
        for sample in range(self.length):
            self.produced += 1
            yield sample

    def __len__(self) -> int:
        return self.length


def _epoch(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _flat(batches) -> list[int]:
    return [sample for batch in batches for sample in batch]


def rank_report() -> dict:
    from accelerate_ref import Accelerator, GradientState, PartialState
    from accelerate_ref.data_loader import prepare_data_loader, skip_first_batches
    from accelerate_ref.utils import gather, set_seed, synchronize_rng_states

    Accelerator(cpu=True)  # the RNG synchronisation reads its state (HF 1.15 raises ValueError without one)
    state = PartialState()
    rank = state.process_index
    placed = {"device": state.device, "put_on_device": True}
    report: dict = {}

    torch.manual_seed(100 + rank)  # every rank's RNG differs until synchronised
    shuffled = prepare_data_loader(DataLoader(range(48), batch_size=2, shuffle=True), rng_types=["generator"])
    report["generator_epochs"] = [_flat(_epoch(shuffled)) for _ in range(2)]
    torch_synced = prepare_data_loader(DataLoader(range(48), batch_size=2, shuffle=True), rng_types=["torch"])
    report["torch_epoch"] = _flat(_epoch(torch_synced))

    generator = torch.Generator().manual_seed(7 + rank)
    synchronize_rng_states(["torch", "generator"], generator)
    report["synced_draws"] = (torch.rand(3).tolist(), torch.rand(3, generator=generator).tolist())
    set_seed(5, device_specific=True)
    report["device_specific_draw"] = torch.rand(2).tolist()
    set_seed(5)
    report["common_draw"] = torch.rand(2).tolist()

    stream = CountingStream(STREAM)
    dispatched = prepare_data_loader(DataLoader(stream, batch_size=BATCH), **placed)
    flags = []
    for batch in dispatched:
        flags.append((batch.tolist(), GradientState().end_of_dataloader, GradientState().remainder))
    report["dispatched"], report["produced"] = flags, stream.produced
    report["dispatched_split"] = _epoch(
        prepare_data_loader(DataLoader(range(STREAM), batch_size=2 * state.num_processes), split_batches=True, dispatch_batches=True, **placed)
    )
    report["dispatched_words"] = [
        (batch["id"].tolist(), batch["text"]) for batch in prepare_data_loader(DataLoader(WordStream(), batch_size=BATCH), **placed)
    ]
    report["dispatched_drop_last"] = _epoch(
        prepare_data_loader(DataLoader(CountingStream(STREAM), batch_size=BATCH, drop_last=True), **placed)
    )

    lengths, skips = [], []
    for name, loader in {
        "shard": prepare_data_loader(DataLoader(range(STREAM), batch_size=BATCH)),
        "uneven": prepare_data_loader(DataLoader(range(STREAM), batch_size=BATCH), even_batches=False),
        "split uneven": prepare_data_loader(
            DataLoader(range(STREAM), batch_size=2 * state.num_processes), split_batches=True, even_batches=False
        ),
        "stream shard": prepare_data_loader(DataLoader(CountingStream(STREAM), batch_size=BATCH), dispatch_batches=False),
        "dispatched map": prepare_data_loader(DataLoader(range(STREAM), batch_size=BATCH), dispatch_batches=True, **placed),
        "dispatched stream": prepare_data_loader(DataLoader(CountingStream(STREAM), batch_size=BATCH), **placed),
    }.items():
        full = _epoch(loader)
        skipped = skip_first_batches(loader, num_batches=1)
        rest = _epoch(skipped)
        lengths += [(name, len(loader), len(full)), (f"{name}, skipped", len(skipped), len(rest))]
        skips.append((name, rest == full[1:]))
    report["lengths"], report["skips"] = lengths, skips

    gathered = []
    for batch in prepare_data_loader(DataLoader(range(STREAM), batch_size=BATCH)):
        everything = gather(batch)
        keep = GradientState().remainder if GradientState().end_of_dataloader else len(everything)
        gathered += everything[: keep or len(everything)].tolist()
    report["gathered"] = gathered
    return report


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"{w[1]}x{w[0] // w[1]}" if w[1] > 1 else str(w[0]))
def reports(request):
    size, machines = request.param
    return size, simulators.run(rank_report, world=size, machines=machines, timeout=180, env={"OMP_NUM_THREADS": "1"})


def _partition(per_rank: list[list[int]], length: int) -> bool:
    return Counter(sample for samples in per_rank for sample in samples) == Counter(range(length))


@pytest.mark.slow
def test_shuffles_agree_so_shards_are_disjoint(reports):
    size, values = reports
    for epoch in range(2):
        assert _partition([v["generator_epochs"][epoch] for v in values], 48), f"epoch {epoch}"
    assert values[0]["generator_epochs"][0] != values[0]["generator_epochs"][1], "each epoch shuffles anew"
    assert _partition([v["torch_epoch"] for v in values], 48), 'rng_types=["torch"] keeps the sampler on the synced global RNG'


@pytest.mark.slow
def test_rng_synchronisation_and_seeding(reports):
    size, values = reports
    assert all(v["synced_draws"] == values[0]["synced_draws"] for v in values)
    assert all(v["common_draw"] == values[0]["common_draw"] for v in values)
    assert len({tuple(v["device_specific_draw"]) for v in values}) == size
    torch.manual_seed(5 + 1)
    assert values[1]["device_specific_draw"] == torch.rand(2).tolist(), "device_specific adds the process index"


@pytest.mark.slow
def test_dispatching(reports):
    size, values = reports
    assert [v["produced"] for v in values] == [STREAM] + [0] * (size - 1), "only rank 0 reads the stream"
    steps = math.ceil(STREAM / (BATCH * size))
    for rank, value in enumerate(values):
        flags = [(end, remainder) for _, end, remainder in value["dispatched"]]
        assert [end for end, _ in flags] == [False] * (steps - 1) + [True], f"rank {rank}"
        assert flags[-1][1] == STREAM - (steps - 1) * BATCH * size, "remainder: real samples of the last step"
    joined = [_flat(v["dispatched"][step][0] for v in values) for step in range(steps)]
    assert _flat(joined)[:STREAM] == list(range(STREAM))
    assert _flat(joined)[STREAM:] == [i % STREAM for i in range(len(_flat(joined)) - STREAM)], "padding from the start"
    split = [_flat(v["dispatched_split"][step] for v in values) for step in range(len(values[0]["dispatched_split"]))]
    assert _flat(split)[:STREAM] == list(range(STREAM))
    assert all(len(step) == 2 * size for step in split)
    kept = STREAM // (BATCH * size) * BATCH * size
    assert sorted(_flat(_flat(v["dispatched_drop_last"]) for v in values)) == list(range(kept))


@pytest.mark.slow
def test_dispatching_strings(reports):
    """Non-tensor samples (a list of strings per batch) are dispatched and sliced as the tensors beside them are.

    HF 1.15 raises a TypeError here (its `find_batch_size`/`broadcast` take tensors only); issue 13 asks for them.
    """
    size, values = reports
    steps = math.ceil(STREAM / (BATCH * size))
    for rank, value in enumerate(values):
        assert len(value["dispatched_words"]) == steps, f"rank {rank}"
        for ids, texts in value["dispatched_words"]:
            assert texts == [f"w{sample}" for sample in ids], f"rank {rank}: each id keeps its own string"
    joined = _flat(_flat(v["dispatched_words"][step][0] for v in values) for step in range(steps))
    assert joined[:STREAM] == list(range(STREAM))


@pytest.mark.slow
def test_len_tells_the_truth_and_skipping_keeps_the_rest(reports):
    size, values = reports
    wrong = [(rank, entry) for rank, v in enumerate(values) for entry in v["lengths"] if entry[1] != entry[2]]
    assert wrong == []
    assert all(same for v in values for _, same in v["skips"]), [v["skips"] for v in values]


@pytest.mark.slow
def test_gathered_epoch_trimmed_by_remainder_is_the_dataset(reports):
    size, values = reports
    assert all(v["gathered"] == list(range(STREAM)) for v in values)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
@needs_torchdata
@pytest.mark.slow
def test_prepared_loaders_are_what_hfs_are_at_world_2() -> None:
    for rank, report in enumerate(simulators.run(loader_comparison, world=2, timeout=180, env=RANK_ENV)):
        for stateful, seen in report.items():
            assert loader_differences(seen["accelerate"], seen["accelerate_ref"]) == {}, (rank, stateful)
