"""Saving and loading across ranks: per-rank states, resumption at worlds 2-4 and 2x2, failures on one rank.

One launch per world runs `checkpoint_checks` on every rank; each phase
builds a fresh Accelerator (the process group stays up) and returns what it
saw. Afterwards this process (one rank) must refuse the checkpoint those
ranks wrote. Catalog: save_state.roundtrip, save_state.resume_data_order,
save.once_per_machine.
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from torch.utils.data import DataLoader

import simulators
from accelerate_ref import (
    Accelerator,
    AcceleratorState,
    DataLoaderConfiguration,
    GradientState,
    ProjectConfiguration,
)
from accelerate_ref._checkpointing.store import CheckpointError
from accelerate_ref.utils import set_seed


def fresh(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


def batches(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def resume_phase(folder: str, seedable: bool) -> dict:
    """Uninterrupted epochs 0-2 against: epoch 0, 3 batches of epoch 1, save; load, skip 3, rest, epoch 2."""

    def run(seed: int):
        set_seed(seed)
        acc = fresh(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable))
        return acc, acc.prepare(DataLoader(torch.arange(96), batch_size=2, shuffle=True))

    acc, loader = run(3)
    uninterrupted = [batches(loader) for _ in range(3)]
    acc, loader = run(3)
    resumed = batches(loader)
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(3)]
    acc.save_state(folder)
    acc, loader = run(50 + acc.process_index)
    acc.load_state(folder)
    resumed = [resumed, head + batches(acc.skip_first_batches(loader, 3)), batches(loader)]
    return {"same": resumed == uninterrupted, "epoch1": uninterrupted[1]}


def roundtrip_phase(folder: str) -> dict:
    """Weights and every process's own RNG states come back; the draws differ between processes."""
    acc = fresh()
    set_seed(1, device_specific=True)
    model = acc.prepare(torch.nn.Linear(3, 2))
    acc.save_state(folder)
    expected = [random.random(), torch.rand(2).tolist(), torch.nn.utils.parameters_to_vector(model.parameters()).tolist()]
    set_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    acc.load_state(folder)
    got = [random.random(), torch.rand(2).tolist(), torch.nn.utils.parameters_to_vector(model.parameters()).tolist()]
    return {"same": got == expected, "draw": expected[0], "files": sorted(os.listdir(folder))}


def failure_phase(folder: str) -> dict:
    """A save hook fails on the last rank only: every rank raises, the checkpoint saved before stays as it was."""
    acc = fresh()
    model = acc.prepare(torch.nn.Linear(3, 2))
    acc.save_state(folder)
    before = {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}

    def hook(models, weights, directory):
        if acc.is_last_process:
            raise OSError("disk full on the last rank")

    acc.register_save_state_pre_hook(hook)
    with torch.no_grad():
        acc.unwrap_model(model).weight.add_(1.0)
    try:
        acc.save_state(folder)
        raised = ""
    except Exception as error:
        raised = f"{type(error).__name__}: {error}"
    acc.wait_for_everyone()
    after = {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}
    parent = os.path.dirname(folder)
    return {"raised": raised, "unchanged": after == before, "siblings": sorted(os.listdir(parent))}


def each_node_phase(folder: str) -> dict:
    """``save_on_each_node`` on a file system the machines share: one complete checkpoint, which loads."""
    acc = fresh(project_config=ProjectConfiguration(save_on_each_node=True))
    acc.prepare(torch.nn.Linear(3, 2))
    acc.save_state(folder)
    acc.load_state(folder)
    return {"files": sorted(os.listdir(folder))}


def checkpoint_checks(root: str) -> dict:
    rank = int(os.environ["RANK"])
    report = {
        "resume": {name: resume_phase(os.path.join(root, f"resume_{name}"), seedable) for name, seedable in (("shuffle", False), ("seedable", True))},
        "roundtrip": roundtrip_phase(os.path.join(root, "roundtrip")),
        "failure": failure_phase(os.path.join(root, "failure", "ckpt")),
        "each_node": each_node_phase(os.path.join(root, "each_node")),
    }
    report["rank"] = rank
    return report


@pytest.mark.slow
@pytest.mark.parametrize("size, machines", [(2, 1), (3, 1), (4, 1), (4, 2)], ids=["2", "3", "4", "2x2"])
def test_checkpoints_across_ranks(tmp_path, size, machines):
    reports = simulators.run(checkpoint_checks, world=size, machines=machines, args=(str(tmp_path),), timeout=300)
    for rank, report in enumerate(reports):
        for name, resume in report["resume"].items():
            assert resume["same"], f"rank {rank}, {name}: the resumed run's batches differ from the uninterrupted run's"
        assert report["roundtrip"]["same"], f"rank {rank}: weights or RNG states not restored"
        failure = report["failure"]
        assert failure["raised"], f"rank {rank}: a save that failed on the last rank returned normally"
        assert ("disk full" in failure["raised"]) if rank == size - 1 else ("process" in failure["raised"] and "disk full" in failure["raised"])
        assert failure["unchanged"] and failure["siblings"] == ["ckpt"], f"rank {rank}: {failure}"
    epochs = [set(map(tuple, report["resume"]["shuffle"]["epoch1"])) for report in reports]
    assert len(set().union(*epochs)) == sum(map(len, epochs)), "shards of one epoch overlap across ranks"
    assert len({report["roundtrip"]["draw"] for report in reports}) == size, "every rank restored its own RNG state"
    expected = {f"random_states_{rank}.pkl" for rank in range(size)} | {"model.safetensors", "checkpoint.json"}
    assert expected <= set(reports[0]["roundtrip"]["files"]) and expected <= set(reports[0]["each_node"]["files"])
    with pytest.raises(CheckpointError, match=f"saved by {size} processes and this run has 1"):
        fresh().load_state(tmp_path / "roundtrip")
