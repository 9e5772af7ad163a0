"""simulators.devices.memory.history: the books' bounded timeline, and the allocation history as torch's memory snapshot."""

from __future__ import annotations

import gc

import pytest
import torch

from simulators.devices.memory import history
from simulators.devices.memory.history import CAP, Timeline
from simulators.devices.memory.books import DeviceMemory


def test_a_short_timeline_keeps_every_change_its_peak_and_its_steps():
    timeline = Timeline()
    for allocated in (10, 30, 20):
        timeline.add(allocated, 64)
        if allocated == 30:
            timeline.peaked(30, 64)
    timeline.step(2)
    timeline.add(5, 64)
    assert timeline.report() == {"events": 4, "stride": 1, "points": [[1, 10, 64], [2, 30, 64], [3, 20, 64], [4, 5, 64]],
                                 "steps": [[3, 2]], "peak": [2, 30, 64]}


def test_a_long_timeline_stays_under_its_cap_as_the_upper_envelope_with_the_peak_exact():
    timeline, changes = Timeline(), 20 * CAP + 7
    for event in range(1, changes + 1):
        allocated = 1000 + event % 97 + (50_000 if event == 12_345 else 0)
        timeline.add(allocated, allocated + 100 + (900_000 if event == 40_000 else 0))
        if event == 12_345:
            timeline.peaked(allocated, allocated + 100)
    found = timeline.report()
    assert found["events"] == changes and len(found["points"]) < CAP and found["stride"] > 1
    assert found["peak"] == [12_345, 1000 + 12_345 % 97 + 50_000, 1000 + 12_345 % 97 + 50_100]
    assert max(point[1] for point in found["points"]) == found["peak"][1]  # the envelope keeps the highest change
    assert max(point[2] for point in found["points"]) == 1000 + 40_000 % 97 + 100 + 900_000  # and the reserved one
    events = [point[0] for point in found["points"]]
    assert events == sorted(events) and events[-1] <= changes


def replay(snapshot: dict, device: int) -> tuple[int, int]:
    """Walk ``device``'s trace backwards from the final segments, as torch's MemoryViz does (``simulate_memory``):
    every allocation is live where the trace frees it, every live block lies in a segment at each event. Returns the
    most bytes allocated and reserved at any event, replayed forwards."""
    blocks = {block["address"]: block["requested_size"] for segment in snapshot["segments"] if segment["device"] == device
              for block in segment["blocks"] if block["state"] == "active_allocated"}
    segments = {segment["address"]: segment["total_size"] for segment in snapshot["segments"] if segment["device"] == device}
    allocated, reserved = [sum(blocks.values())], [sum(segments.values())]
    for event in reversed(snapshot["device_traces"][device]):
        action, addr = event["action"], event.get("addr")
        if action == "alloc":
            assert blocks.pop(addr) == event["size"], event
        elif action == "free_completed":
            assert addr not in blocks, event
            blocks[addr] = event["size"]
        elif action == "segment_alloc":
            assert segments.pop(addr) == event["size"], event
        elif action == "segment_free":
            segments[addr] = event["size"]
        for addr in blocks:  # MemoryViz's find_segment must find each block's segment
            assert any(start <= addr < start + size for start, size in segments.items()), (addr, event)
        allocated.append(sum(blocks.values()))
        reserved.append(sum(segments.values()))
    return max(allocated), max(reserved)


def test_the_allocation_history_is_torchs_snapshot_with_the_models_addresses(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    books = DeviceMemory("cuda")
    books.keep_history(True, lambda: [{"filename": "train.py", "line": 7, "name": "<module>"}])
    kept = []
    for size in (100, 3 << 20, 700, 30 << 20, 5):
        payload = torch.empty(size, dtype=torch.uint8)
        books.track(payload, 1)
        kept.append(payload)
    del kept[1], kept[2]  # 3 MiB and 30 MiB
    gc.collect()
    books.empty_cache()
    shot = books.snapshot()
    assert [len(trace) for trace in shot["device_traces"]] == [0, len(shot["device_traces"][1])]
    actions = [event["action"] for event in shot["device_traces"][1]]
    assert actions.count("alloc") == 5 and actions.count("free_requested") == actions.count("free_completed") == 2
    assert actions[-1] == "segment_free" and "segment_alloc" in actions
    assert all(event["frames"][0]["line"] == 7 and event["stream"] == 0 for event in shot["device_traces"][1])
    live = [block for segment in shot["segments"] for block in segment["blocks"] if block["state"] == "active_allocated"]
    assert sorted(block["requested_size"] for block in live) == [5, 100, 700]
    assert sum(segment["total_size"] for segment in shot["segments"]) == books.reserved(1)
    for segment in shot["segments"]:  # the blocks tile their segment in address order
        assert sum(block["size"] for block in segment["blocks"]) == segment["total_size"]
        assert segment["blocks"][0]["address"] == segment["address"]
    most, _ = replay(shot, 1)
    assert most == books.peak(1) == 100 + (3 << 20) + 700 + (30 << 20) + 5
    timeline = books.timelines_report()[1]
    assert timeline["peak"][1] == books.peak(1) and timeline["events"] == 5 + 2 + 1


def test_expandable_segments_trace_their_mapped_pages(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    books = DeviceMemory("cuda")
    books.keep_history(False, lambda: [])
    kept = [torch.empty(size, dtype=torch.uint8) for size in (25 << 20, 50 << 20)]
    for payload in kept:
        books.track(payload, 0)
    shot = books.snapshot()
    maps = [event for event in shot["device_traces"][0] if event["action"] == "segment_map"]
    assert sum(event["size"] for event in maps) == books.reserved(0) == sum(s["total_size"] for s in shot["segments"])
    assert maps[1]["addr"] == maps[0]["addr"] + maps[0]["size"]  # the pages mapped, not the free block they joined
    assert all(segment["is_expandable"] for segment in shot["segments"])
    assert books.timelines_report() == {}


@pytest.mark.parametrize("cap", [8])
def test_the_ring_keeps_the_newest_entries(monkeypatch, cap):
    monkeypatch.setattr(history, "MAX_ENTRIES", cap)
    record = history.AllocationHistory(lambda: [])
    for addr in range(20):
        record.alloc(addr, 1)
    assert [entry[1] for entry in record.entries] == list(range(12, 20))
