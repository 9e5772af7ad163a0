"""Prepared loaders backed by torchdata's StatefulDataLoader (``use_stateful_dataloader``), side by side with HF 1.15.

Each scenario runs HF accelerate's objects and accelerate_ref's on the same
inputs and compares what a user sees: the batches of an epoch, the state
taken while the k-th batch is held, and the batches a fresh prepared loader
yields once that state is loaded (then its next epoch). Worlds 1 (in this
process) and 2 (one simulator launch running both implementations). The
one intended difference: a dispatcher with ``split_batches`` over several
processes, where HF uncounts one batch too many and replays a step
(accelerate_ref._data_loader.adapter's rules).

Without torchdata (`pip install --no-deps torchdata`) only the refusal is tested.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import simulators
from accelerate_ref.utils import is_torchdata_stateful_dataloader_available

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 calls it on torch 2.13
needs_torchdata = pytest.mark.skipif(
    not is_torchdata_stateful_dataloader_available(), reason="torchdata >= 0.8 is not installed (pip install --no-deps torchdata)"
)
IMPLS = ("accelerate", "accelerate_ref")
#: (kind, shuffle, split_batches) scenarios; a stream is an IterableDataset, which does not shuffle.
SCENARIOS = [
    ("shard", False, False), ("shard", True, False), ("shard", True, True),
    ("dispatcher", False, False), ("dispatcher", True, False), ("dispatcher", False, True),
    ("stream shard", False, False), ("stream dispatcher", False, True),
]
HELD = 3  # batches handed out before the state is taken


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(22))


@pytest.fixture
def fresh_states():
    """Both implementations' process-wide states forgotten before and after the test."""

    def reset() -> None:
        for impl in IMPLS:
            state = importlib.import_module(f"{impl}.state")
            state.AcceleratorState._reset_state(True)
            state.GradientState._reset_state()

    reset()
    yield
    reset()


def _prepared(impl: str, kind: str, shuffle: bool, split: bool) -> DataLoader:
    """A stateful prepared loader of ``kind``, built after ``set_seed(0)`` as a script (re)started would."""
    data_loader = importlib.import_module(f"{impl}.data_loader")
    importlib.import_module(f"{impl}.utils").set_seed(0)
    processes = importlib.import_module(f"{impl}.state").PartialState().num_processes
    batch_size = 2 * processes if split else 2
    dataset = Stream() if kind.startswith("stream") else range(22)
    user_loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle or None)
    placement = {"dispatch_batches": True, "put_on_device": True} if kind.endswith("dispatcher") else {"dispatch_batches": False}
    rng_types = ["generator"] if processes > 1 else None  # world 1: prepare_data_loader's default, HF's order
    return data_loader.prepare_data_loader(
        user_loader, split_batches=split, rng_types=rng_types, use_stateful_dataloader=True, **placement
    )


def _batches(loader) -> list:
    return [batch.tolist() for batch in loader]


def resumed(impl: str, kind: str, shuffle: bool, split: bool) -> dict:
    """An epoch, its states batch by batch, and what a fresh loader yields from the state taken at batch HELD.

    The state loaded everywhere is process 0's (what `Accelerator.save_state` writes); torch's RNG is moved on
    before resuming, as a restarted run's would be.
    """
    full_loader, full, full_states = _prepared(impl, kind, shuffle, split), [], []
    for batch in full_loader:
        full.append(batch.tolist())
        full_states.append(full_loader.state_dict())
    loader = _prepared(impl, kind, shuffle, split)
    batches = iter(loader)
    held = [next(batches).tolist() for _ in range(HELD)]
    saved = [loader.state_dict()]
    importlib.import_module(f"{impl}.utils").broadcast_object_list(saved, from_process=0)
    fresh = _prepared(impl, kind, shuffle, split)
    torch.manual_seed(999)
    fresh.load_state_dict(saved[0])
    rest = _batches(fresh)
    return {"full": full, "states": full_states, "held": held, "rest": rest, "next epoch": _batches(fresh),
            "stateful": type(fresh.base_dataloader).__name__}


def _adjusted(impl: str) -> dict:
    """The adapter's own prefetch correction on a hand-made state (HF: counts lowered by num_processes - 1)."""
    adapter = importlib.import_module(f"{impl}.data_loader").DataLoaderAdapter(range(8), use_stateful_dataloader=True,
                                                                               batch_size=2)
    adapter.dl_state_dict = {"_sampler_iter_yielded": 5, "_num_yielded": 5, "_index_sampler_state": {"samples_yielded": 10}}
    adapter.adjust_state_dict_for_prefetch()
    return adapter.dl_state_dict


def _skipping_state(impl: str) -> int:
    """The batches a stateful SkipDataLoader's state counts while its second batch (the third drawn) is held."""
    loader = importlib.import_module(f"{impl}.data_loader").SkipDataLoader(range(12), skip_batches=1, batch_size=2,
                                                                           use_stateful_dataloader=True)
    batches = iter(loader)
    next(batches), next(batches)
    return loader.state_dict()["_num_yielded"]


def rank_comparison() -> dict:
    """On every rank of a world: both implementations through every scenario."""
    report: dict = {}
    for impl in IMPLS:
        importlib.import_module(impl).Accelerator(cpu=True)
        report[impl] = {scenario: resumed(impl, *scenario) for scenario in SCENARIOS}
        report[impl]["adjusted"], report[impl]["skipping"] = _adjusted(impl), _skipping_state(impl)
    return report


def _check_against_hf(hf: dict, ref: dict, world: int, rank: int) -> None:
    for scenario in SCENARIOS:
        theirs, ours = hf[scenario], ref[scenario]
        where = f"{scenario} at world {world}, rank {rank}"
        draws = rank == 0 or not scenario[0].endswith("dispatcher")  # only process 0 draws a dispatcher's batches
        assert ours["stateful"] == "StatefulDataLoader", where
        assert ours["full"] == theirs["full"] and ours["held"] == theirs["held"] == ours["full"][:HELD], where
        assert ours["next epoch"] == theirs["next epoch"], where
        if scenario[0].endswith("dispatcher") and scenario[2] and world > 1:
            # HF's correction uncounts num_processes - 1 batches where only the held step was drawn: it replays one
            assert theirs["rest"][1:] == ours["rest"] and theirs["rest"][0] == ours["held"][-1], where
            if draws:
                assert [s["_num_yielded"] for s in ours["states"]] == list(range(1, len(ours["full"]))) + [len(ours["full"])]
            continue
        assert ours["rest"] == theirs["rest"], where
        if draws:
            assert ours["states"] == theirs["states"], where
        if not scenario[1]:  # in order: the resumed loader goes on at the next batch
            assert ours["held"] + ours["rest"] == ours["full"], where


@needs_torchdata
def test_world_1_resumes_as_hf_does(fresh_states):
    for impl in IMPLS:
        importlib.import_module(impl).PartialState()
    hf = {scenario: resumed("accelerate", *scenario) for scenario in SCENARIOS if not scenario[2]}
    ref = {scenario: resumed("accelerate_ref", *scenario) for scenario in hf}
    for scenario in hf:
        assert ref[scenario]["full"] == hf[scenario]["full"], scenario
        assert ref[scenario]["states"] == hf[scenario]["states"], scenario
        assert ref[scenario]["rest"] == hf[scenario]["rest"], scenario
        assert ref[scenario]["next epoch"] == hf[scenario]["next epoch"], scenario
    assert ref[("shard", False, False)]["held"] + ref[("shard", False, False)]["rest"] == ref[("shard", False, False)]["full"]


@needs_torchdata
@pytest.mark.slow
def test_world_2_resumes_as_hf_does():
    reports = simulators.run(rank_comparison, world=2, timeout=180, env={"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"})
    for rank, report in enumerate(reports):
        _check_against_hf(report["accelerate"], report["accelerate_ref"], 2, rank)
        assert report["accelerate_ref"]["adjusted"] == report["accelerate"]["adjusted"]
        assert report["accelerate_ref"]["adjusted"]["_num_yielded"] == 4
        # a SkipDataLoader draws nothing ahead: HF's default correction undercounts it by num_processes - 1
        assert report["accelerate_ref"]["skipping"] == 3 and report["accelerate"]["skipping"] == 2


@needs_torchdata
def test_skip_data_loader_and_adapter_keep_hfs_state(fresh_states):
    """SkipDataLoader's and DataLoaderAdapter's state, batch by batch, as HF's (world 1)."""
    seen = {}
    for impl in IMPLS:
        data_loader = importlib.import_module(f"{impl}.data_loader")
        importlib.import_module(impl).PartialState()
        loader = data_loader.SkipDataLoader(range(12), skip_batches=2, use_stateful_dataloader=True, batch_size=2)
        initial = loader.state_dict()
        states, batches = [], []
        for batch in loader:
            batches.append(batch.tolist())
            states.append(dict(loader.state_dict()))
        fresh = data_loader.SkipDataLoader(range(12), skip_batches=2, use_stateful_dataloader=True, batch_size=2)
        fresh.load_state_dict(states[0])  # the state while the first batch (the third drawn) is held
        adapter = data_loader.DataLoaderAdapter(range(6), use_stateful_dataloader=True, batch_size=3)
        seen[impl] = (initial, batches, states, _batches(fresh), adapter.state_dict(), type(adapter.base_dataloader).__name__)
    (initial, batches, states, resumed_batches, adapter_state, base), theirs = seen["accelerate_ref"], seen["accelerate"]
    assert (initial, batches, resumed_batches, adapter_state, base) == (theirs[0], theirs[1], theirs[3], theirs[4], theirs[5])
    assert batches == [[4, 5], [6, 7], [8, 9], [10, 11]] and resumed_batches == [[10, 11]]  # HF skips again after resuming
    assert states[:-1] == theirs[2][:-1] and base == "StatefulDataLoader"
    # its last state marks the epoch finished, as a DataLoaderShard's does; HF's SkipDataLoader never marks it
    assert states[-1] == {**theirs[2][-1], "_iterator_finished": True}


@needs_torchdata
def test_save_state_carries_the_loader_state_as_hf_does(fresh_states, tmp_path: Path):
    """`Accelerator.save_state` writes dl_state_dict.bin (HF's file); `load_state` resumes a fresh loader from it."""
    outcome = {}
    for impl in IMPLS:
        top = importlib.import_module(impl)
        config = top.DataLoaderConfiguration(use_stateful_dataloader=True)
        accelerator = top.Accelerator(dataloader_config=config, cpu=True)
        loader = accelerator.prepare(DataLoader(range(20), batch_size=2))
        batches = iter(loader)
        held = [next(batches).tolist() for _ in range(HELD)]
        accelerator.save_state(tmp_path / impl)
        saved = torch.load(tmp_path / impl / "dl_state_dict.bin", weights_only=True)
        again = top.Accelerator(dataloader_config=config, cpu=True)
        fresh = again.prepare(DataLoader(range(20), batch_size=2))
        again.load_state(tmp_path / impl)
        outcome[impl] = (held, saved, _batches(fresh), (tmp_path / impl / "sampler.bin").exists())
    assert outcome["accelerate_ref"] == outcome["accelerate"]
    held, saved, rest, sampler_file = outcome["accelerate_ref"]
    assert held + rest == [[i, i + 1] for i in range(0, 20, 2)] and saved["_num_yielded"] == HELD and not sampler_file


def test_without_torchdata_it_is_hfs_import_error(monkeypatch, fresh_states):
    """``use_stateful_dataloader=True`` without torchdata: ImportError naming it, in HF's words; nothing else changes."""
    import accelerate.data_loader as hf_data_loader

    from accelerate_ref._data_loader import adapter as data_loader_adapter
    from accelerate_ref.data_loader import SkipDataLoader, prepare_data_loader

    monkeypatch.setattr(data_loader_adapter, "is_torchdata_stateful_dataloader_available", lambda: False)
    monkeypatch.setattr(hf_data_loader, "is_torchdata_stateful_dataloader_available", lambda: False)
    hf_data_loader.PartialState()
    with pytest.raises(ImportError) as theirs:
        hf_data_loader.prepare_data_loader(DataLoader(range(4), batch_size=2), use_stateful_dataloader=True)
    assert "torchdata" in str(theirs.value)
    for make in (
        lambda: prepare_data_loader(DataLoader(range(4), batch_size=2), use_stateful_dataloader=True),
        lambda: prepare_data_loader(DataLoader(Stream(), batch_size=2), put_on_device=True, use_stateful_dataloader=True),
        lambda: SkipDataLoader(range(4), skip_batches=1, use_stateful_dataloader=True),
    ):
        with pytest.raises(ImportError) as ours:
            make()
        assert str(ours.value) == str(theirs.value)
    plain = prepare_data_loader(DataLoader(range(4), batch_size=2))
    assert plain.use_stateful_dataloader is False and [b.tolist() for b in plain] == [[0, 1], [2, 3]]
