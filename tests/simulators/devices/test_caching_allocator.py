"""The model of torch's CUDA caching allocator (``simulators.devices.memory.caching_allocator``): its rules one by one, and
every allocation of real H200 runs replayed through it (``../shared/gpu``: torch 2.11 allocator snapshots of two
AdamW steps of each model of benchmarks/preflight_models.py, fp32 and bf16, and the max_memory_reserved of each run).

A snapshot's trace starts after the model and the optimizer were made (and after earlier runs in the same process),
so its initial state is rebuilt from the snapshot itself: the segments it ends with that no ``segment_alloc`` of the
trace made existed before, holding the blocks allocated at the end that the trace did not allocate and the blocks the
trace frees without allocating them (at their rounded requested size: the rest of an unsplit large block, at most
1 MiB, is a free block no large request can take, so the difference cannot show).
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from simulators.devices.memory.caching_allocator import (
    LARGE_BUFFER, MB, SMALL_BUFFER, AllocatorOutOfMemory, Block, CachingAllocator, Settings, round_size,
)

GROUND_TRUTH = Path(__file__).resolve().parents[4] / "shared" / "gpu"
RUNS = sorted(path.stem for path in GROUND_TRUTH.glob("*.pickle"))
needs_ground_truth = pytest.mark.skipif(not RUNS, reason=f"no GPU allocator snapshots in {GROUND_TRUTH} (shared/gpu beside the checkout)")


def segments_made(allocator: CachingAllocator) -> list[int]:
    return [size for action, _, size in allocator.history if action == "segment_alloc"]


def recording(**settings) -> CachingAllocator:
    allocator = CachingAllocator(Settings(**settings))
    allocator.history = []
    return allocator


# -- the rules -----------------------------------------------------------------------------------------------------


def test_requests_are_rounded_to_512_bytes_and_small_ones_share_a_2_mib_segment():
    allocator = recording()
    assert [round_size(n) for n in (1, 512, 513, 4000)] == [512, 512, 1024, 4096]
    blocks = [allocator.malloc(n) for n in (4, 1000, MB)]
    assert [b.size for b in blocks] == [512, 1024, MB]
    assert [b.addr - blocks[0].addr for b in blocks] == [0, 512, 1536], "split off one segment, lowest addresses first"
    assert segments_made(allocator) == [SMALL_BUFFER] and allocator.reserved == SMALL_BUFFER
    assert allocator.allocated == 512 + 1024 + MB


def test_large_requests_under_10_mib_get_a_20_mib_segment_larger_ones_their_size_rounded_to_2_mib():
    allocator = recording()
    allocator.malloc(MB + 1)
    allocator.malloc(9 * MB)  # the rest of the first 20 MiB segment holds it
    allocator.malloc(11 * MB)
    allocator.malloc(10 * MB + 1)
    assert segments_made(allocator) == [LARGE_BUFFER, 12 * MB, 12 * MB]


def test_a_freed_block_is_reused_by_best_fit_and_merged_with_its_free_neighbours():
    allocator = recording()
    first, second, third = (allocator.malloc(4 * MB) for _ in range(3))
    allocator.free(second)
    assert allocator.malloc(3 * MB).addr == second.addr, "the 4 MiB hole fits better than the 8 MiB rest"
    allocator.free(first)
    allocator.free(third)
    allocator.malloc(15 * MB)  # first's hole and third's merged with the rest: 4 + 12 MiB is not enough
    assert segments_made(allocator) == [LARGE_BUFFER, 16 * MB]
    assert allocator.reserved == LARGE_BUFFER + 16 * MB and allocator.max_reserved == allocator.reserved


def test_a_large_block_is_split_only_when_more_than_1_mib_would_be_left():
    allocator = recording()
    whole = allocator.malloc(12 * MB)
    allocator.free(whole)
    exact = allocator.malloc(11 * MB)
    assert exact.size == 12 * MB, "1 MiB left: the block is handed out whole"
    allocator.free(exact)
    split = allocator.malloc(10 * MB + 512)
    assert split.size == 10 * MB + 512 and segments_made(allocator) == [12 * MB]


def test_empty_cache_releases_only_fully_free_segments_and_peaks_reset_to_what_is_reserved():
    allocator = recording()
    kept, freed = allocator.malloc(30 * MB), allocator.malloc(40 * MB)
    part = allocator.malloc(1000)
    allocator.free(freed)
    allocator.empty_cache()
    assert allocator.reserved == 30 * MB + SMALL_BUFFER and allocator.max_reserved == 70 * MB + SMALL_BUFFER
    allocator.reset_peak()
    assert allocator.max_reserved == allocator.reserved
    allocator.free(kept)
    allocator.free(part)
    allocator.empty_cache()
    assert allocator.reserved == 0 and [a for a, _, _ in allocator.history] == ["segment_alloc"] * 3 + ["segment_free"] * 3


def test_past_the_capacity_the_cache_is_released_before_out_of_memory():
    allocator = recording()
    allocator.capacity = 64 * MB
    allocator.free(allocator.malloc(40 * MB))
    allocator.malloc(50 * MB)  # 40 + 50 > 64: the cached 40 MiB segment goes back first
    assert allocator.reserved == 50 * MB and segments_made(allocator) == [40 * MB, 50 * MB]
    with pytest.raises(AllocatorOutOfMemory) as refused:
        allocator.malloc(5 * MB)
    assert (refused.value.size, refused.value.reserved) == (LARGE_BUFFER, 50 * MB), "it asks for a whole 20 MiB segment"


def test_max_split_size_keeps_oversize_blocks_whole_and_away_from_small_requests():
    allocator = recording(max_split_size=40 * MB)
    big = allocator.malloc(60 * MB)
    allocator.free(big)
    assert allocator.malloc(50 * MB).size == 60 * MB, "within 20 MiB of an oversize block: taken whole"
    allocator.malloc(30 * MB)
    assert segments_made(allocator) == [60 * MB, 30 * MB], "a request under 40 MiB never takes an oversize block"


def test_expandable_segments_grow_in_pages_of_2_mib_small_and_20_mib_large():
    allocator = recording(expandable_segments=True)
    allocator.malloc(1000)
    first = allocator.malloc(5 * MB)
    second = allocator.malloc(30 * MB)
    assert second.addr == first.addr + first.size, "one segment per pool, grown at its end"
    # the 15 MiB left free after first's 5 and one more 20 MiB page hold second's 30
    assert [(a, s) for a, _, s in allocator.history] == [("segment_map", SMALL_BUFFER)] + [("segment_map", LARGE_BUFFER)] * 2
    allocator.free(second)
    allocator.empty_cache()  # the pages wholly free are unmapped; the one first's block is on stays
    assert allocator.reserved == SMALL_BUFFER + LARGE_BUFFER


def test_settings_are_read_from_the_allocator_variables_as_torch_reads_them():
    assert Settings.from_env({}) == Settings()
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6"}
    assert Settings.from_env(conf) == Settings(max_split_size=128 * MB, expandable_segments=True)
    assert Settings.from_env({**conf, "PYTORCH_ALLOC_CONF": "max_non_split_rounding_mb:64"}) == Settings(max_non_split_rounding_size=64 * MB)
    with pytest.raises(ValueError, match="max_split_size_mb too small, must be >= 20"):
        Settings.from_env({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:8"})


# -- real runs ---------------------------------------------------------------------------------------------------


def replay(run: str, addresses: bool) -> tuple[CachingAllocator, dict, dict[int, Block], list[int]]:
    """Run ``run``'s allocations through the model from its initial state. With ``addresses``, cudaMalloc returns the
    addresses the GPU gave (else the model's own). Returns the allocator, the snapshot, the live blocks by address and
    the trace's allocations whose block the model put at another address."""
    with open(GROUND_TRUTH / f"{run}.pickle", "rb") as stream:
        snapshot = pickle.load(stream)
    trace = snapshot["device_traces"][0]
    assert {event["stream"] for event in trace} == {0} and not snapshot["allocator_settings"]["expandable_segments"]
    made = [event["addr"] for event in trace if event["action"] == "segment_alloc"]
    live, freed_before = set(), {}
    for event in trace:
        if event["action"] == "alloc":
            live.add(event["addr"])
        elif event["action"] == "free_completed":
            if event["addr"] in live:
                live.discard(event["addr"])
            else:
                freed_before[event["addr"]] = event["size"]
    given = iter(made)
    allocator = CachingAllocator(Settings(), address=(lambda size: next(given)) if addresses else None)
    blocks: dict[int, Block] = {}
    for segment in snapshot["segments"]:
        if segment["address"] in made:
            continue
        start, end = segment["address"], segment["address"] + segment["total_size"]
        used = [(b["address"], b["size"]) for b in segment["blocks"] if b["state"] == "active_allocated" and b["address"] not in live]
        used += [(address, round_size(size)) for address, size in freed_before.items() if start <= address < end]
        restored = allocator.restore_segment(start, segment["total_size"], segment["segment_type"] == "small", used)
        blocks.update((block.addr, block) for block in restored)
    allocator.history, moved = [], []
    for event in trace:
        if event["action"] == "alloc":
            blocks[event["addr"]] = block = allocator.malloc(event["size"])
            if block.addr != event["addr"]:
                moved.append(event["addr"])
        elif event["action"] == "free_completed":
            allocator.free(blocks.pop(event["addr"]))
    return allocator, snapshot, blocks, moved


def layout(allocator: CachingAllocator, live: dict[int, Block]) -> list[tuple[int, list[tuple[int, bool]]]]:
    """Each segment (address order): its address, and its blocks' sizes and whether allocated."""
    every = [*live.values(), *allocator.small.free.values(), *allocator.large.free.values()]
    segments = []
    for head in sorted((b for b in every if b.prev is None), key=lambda b: b.addr):
        parts, block = [], head
        while block is not None:
            parts.append((block.size, block.allocated))
            block = block.next
        segments.append((head.addr, parts))
    return segments


@needs_ground_truth
@pytest.mark.parametrize("run", RUNS)
def test_a_real_runs_allocations_make_the_same_segments_and_the_same_reserved_peak(run):
    reserved = json.loads((GROUND_TRUTH / "summary.json").read_text())["runs"][run]["reserved"]
    allocator, snapshot, live, moved = replay(run, addresses=True)
    trace = snapshot["device_traces"][0]
    assert segments_made(allocator) == [event["size"] for event in trace if event["action"] == "segment_alloc"]
    assert moved == [], "every block at the address the GPU's allocator gave it"
    assert allocator.max_reserved == reserved
    assert layout(allocator, live) == [(s["address"], [(b["size"], b["state"] == "active_allocated") for b in s["blocks"]])
                                       for s in snapshot["segments"]]
    own, _, _, _ = replay(run, addresses=False)  # as the mock runs it: segments at the model's own addresses
    assert segments_made(own) == segments_made(allocator) and own.max_reserved == reserved
