"""The memory books of the mock devices (``simulators.devices.memory.books``), in this process: a ``cuda`` device's books
drive the caching allocator model (issue 33, item 3), the other families reserve what they hold. The books take
CPU (or meta) payloads, so no mock device is installed here; the ranks' view (``torch.cuda``) is in test_cuda.py.
"""
from __future__ import annotations

import gc

import pytest
import torch

from simulators.devices.memory.books import DeviceMemory

MiB = 2**20


@pytest.fixture(autouse=True)
def no_budget_nor_settings(monkeypatch):
    for name in ("SIMULATORS_DEVICE_MEMORY", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)


def tracked(books: DeviceMemory, nbytes: int, index: int = 0) -> torch.Tensor:
    payload = torch.empty(nbytes, dtype=torch.uint8, device="meta")
    books.track(payload, index)
    return payload


def test_a_storage_is_a_malloc_and_its_death_a_free_that_keeps_the_segment():
    books = DeviceMemory("cuda")
    small, large = tracked(books, 100), tracked(books, 11 * MiB)
    assert (books.allocated(0), books.reserved(0)) == (100 + 11 * MiB, 2 * MiB + 12 * MiB)
    del large
    gc.collect()
    assert (books.allocated(0), books.reserved(0)) == (100, 14 * MiB), "the segment stays cached"
    books.empty_cache()
    assert books.reserved(0) == 2 * MiB and books.peak_reserved(0) == 14 * MiB
    books.reset_peak(0)
    assert books.peak_reserved(0) == 2 * MiB
    assert books.summaries()[0]["reserved"] == 2 * MiB and books.summaries()[0]["peak"] == 100
    assert small.numel() == 100


def test_a_resize_takes_the_new_block_before_freeing_the_old_and_a_resize_to_zero_only_frees():
    books = DeviceMemory("cuda")
    payload = tracked(books, 12 * MiB)
    payload.untyped_storage().resize_(14 * MiB)
    books.resized(payload, 0)
    assert books.allocated(0) == 14 * MiB and books.peak_reserved(0) == 12 * MiB + 14 * MiB, "both at once: the copy"
    books.storage_resizing(payload.untyped_storage(), 0)
    assert books.allocated(0) == 0 and books.reserved(0) == 26 * MiB
    books.storage_resizing(payload.untyped_storage(), 12 * MiB)
    assert books.reserved(0) == 26 * MiB, "the cached 12 MiB segment serves it"


def test_past_the_budget_a_segment_that_cannot_be_reserved_is_out_of_memory(monkeypatch):
    monkeypatch.setenv("SIMULATORS_DEVICE_MEMORY", "40MiB")
    books = DeviceMemory("cuda")
    kept = tracked(books, 100)
    tracked(books, 30 * MiB)  # dies at once: its 30 MiB segment stays cached until a segment needs the room
    assert books.info(0) == (40 * MiB - 32 * MiB, 40 * MiB), "mem_get_info counts reserved memory as used"
    big = tracked(books, 31 * MiB)  # a 32 MiB segment: the cached one goes back first
    assert books.reserved(0) == 34 * MiB
    with pytest.raises(torch.OutOfMemoryError) as refused:
        tracked(books, 5 * MiB)
    assert str(refused.value).startswith("CUDA out of memory. Tried to allocate 20.00 MiB (cuda:0; 40.00 MiB total capacity;")
    assert "34.00 MiB reserved in total by PyTorch; 6.00 MiB free" in str(refused.value)
    assert books.allocated(0) == 100 + 31 * MiB and kept.numel() + big.numel() == 100 + 31 * MiB, "nothing counted for it"


def test_expandable_segments_from_the_allocator_variable_grow_in_pages(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    books = DeviceMemory("cuda")
    held = [tracked(books, 11 * MiB), tracked(books, 11 * MiB)]
    assert books.reserved(0) == 40 * MiB and len(held) == 2, "two 20 MiB pages of one segment, not two 12 MiB segments"


def test_the_other_families_reserve_what_they_hold():
    books = DeviceMemory("npu")
    payload = tracked(books, 100)
    assert books.reserved(0) == books.allocated(0) == 100 and books.summaries()[0]["reserved"] == 100
    del payload
    gc.collect()
    books.empty_cache()
    assert books.reserved(0) == 0 and books.peak_reserved(0) == 100
