"""Checkpoints cross implementations: each library resumes from the `save_state` folder the other wrote.

A user who switches mid-project resumes from the other library's folder.
One training run per library (a model with dropout, AdamW, a StepLR
scheduler, a prepared shuffled loader, and a loop that draws from torch,
numpy and Python's RNGs) trains `SAVED_AT` steps of its first epoch and
calls `save_state`; each folder is then resumed by both libraries (a fresh
`Accelerator` after ``set_seed``, as a restarted script would:
`load_state`, the rest of the epoch through `skip_first_batches`, or the
loader itself with ``use_stateful_dataloader``, then one more epoch). A
resumed run is its losses and final parameters, compared with
``torch.equal``. Rules:

* HF's folder: accelerate_ref continues exactly as HF itself does.
* accelerate_ref's folder with the stateful loader: HF continues exactly as
  accelerate_ref does (both restore ``dl_state_dict.bin``).
* accelerate_ref's folder without it: HF continues exactly as it does from
  its own folder of the same run. It cannot continue as accelerate_ref
  does: HF reads no ``sampler.bin`` for a map-style loader, and its
  `skip_first_batches` loader draws the iterator's base seed from torch's
  RNG again, where accelerate_ref's positioned loader replays the epoch
  without it (catalog save_state.resume_data_order; HF's deviation in
  conformance/manifests/accelerate.toml), so the dropout masks differ.

Worlds 2 (one simulator launch for every variant) and 1 (here). At world 1
HF's RandomSampler (given no generator) draws its seed from torch's RNG as
each epoch begins; accelerate_ref's prepared loader seeds its sampler's
generator with the same draw at the same moment, so the same seed gives the
same batches. With the seedable sampler the order is a function of seed and
epoch in both.

Catalog: save_state.roundtrip, save_state.file_names, save_state.auto_naming,
save_state.total_limit, save_state.resume_data_order.
"""

from __future__ import annotations

import importlib
import os
import random
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import simulators
from accelerate_ref.utils import is_torchdata_stateful_dataloader_available

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 calls it on torch 2.13
IMPLS = ("accelerate", "accelerate_ref")
SAVED_AT = 3  # steps of the first epoch trained before save_state
EPOCH = 12  # batches of an epoch at world 1 (24 samples, batches of 2)
WORLD_2 = {"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}


class Loader(NamedTuple):
    """How the run's shuffled loader is prepared."""

    stateful: bool  # DataLoaderConfiguration(use_stateful_dataloader=True): torchdata's StatefulDataLoader
    seedable: bool  # DataLoaderConfiguration(use_seedable_sampler=True)

    def __str__(self) -> str:
        return f"{'stateful' if self.stateful else 'plain'} {'seedable' if self.seedable else 'shuffled'} loader"


HAS_TORCHDATA = is_torchdata_stateful_dataloader_available()
DEFAULT = [Loader(stateful, False) for stateful in (False, True) if HAS_TORCHDATA or not stateful]
SEEDABLE = [Loader(stateful, True) for stateful in (False, True) if HAS_TORCHDATA or not stateful]
Run = tuple[list[torch.Tensor], list[torch.Tensor]]  # losses, final parameters


def _reset_states() -> None:
    for impl in IMPLS:
        state = importlib.import_module(f"{impl}.state")
        state.AcceleratorState._reset_state(True)
        state.GradientState._reset_state()


def _prepared(impl: str, loader: Loader) -> tuple[Any, ...]:
    """(accelerator, model, optimizer, loader, scheduler) as a (re)started script builds them after ``set_seed(0)``."""
    _reset_states()
    library = importlib.import_module(impl)
    library.utils.set_seed(0)
    config = library.DataLoaderConfiguration(
        use_stateful_dataloader=loader.stateful, use_seedable_sampler=loader.seedable
    )
    accelerator = library.Accelerator(cpu=True, dataloader_config=config)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    data = torch.Generator().manual_seed(123)
    dataset = TensorDataset(torch.randn(2 * EPOCH, 4, generator=data), torch.randn(2 * EPOCH, 1, generator=data))
    shuffled = DataLoader(dataset, batch_size=2, shuffle=True)
    return (accelerator, *accelerator.prepare(model, optimizer, shuffled, scheduler))


def _step(accelerator: Any, model: Any, optimizer: Any, scheduler: Any, batch: list[torch.Tensor]) -> torch.Tensor:
    """One training step whose loss depends on dropout and on a draw from each of torch, numpy and Python."""
    inputs, targets = batch
    noise = 0.01 * (torch.randn_like(targets) + float(np.random.rand()) + random.random())
    loss = torch.nn.functional.mse_loss(model(inputs), targets + noise)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.detach().clone()


def train_and_save(impl: str, folder: str, loader: Loader) -> None:
    accelerator, model, optimizer, prepared, scheduler = _prepared(impl, loader)
    batches = iter(prepared)
    for _ in range(SAVED_AT):
        _step(accelerator, model, optimizer, scheduler, next(batches))
    accelerator.save_state(folder)


def resume(impl: str, folder: str, loader: Loader) -> Run:
    """The rest of the first epoch and the whole second one, after loading ``folder``."""
    accelerator, model, optimizer, prepared, scheduler = _prepared(impl, loader)
    accelerator.load_state(folder)
    rest = prepared if loader.stateful else accelerator.skip_first_batches(prepared, SAVED_AT)
    losses = [_step(accelerator, model, optimizer, scheduler, batch) for epoch in (rest, prepared) for batch in epoch]
    return losses, [parameter.detach().clone() for parameter in model.parameters()]


def crossing(root: str, loaders: list[Loader]) -> dict[tuple[Loader, str, str], Run]:
    """Every (loader, writer, reader): the reader's run resumed from the writer's folder."""
    for impl in IMPLS:
        importlib.import_module(impl).PartialState(cpu=True)
    runs = {}
    try:
        for loader in loaders:
            for writer in IMPLS:
                folder = os.path.join(root, f"{writer} {loader}".replace(" ", "-"))
                train_and_save(writer, folder, loader)
                for reader in IMPLS:
                    runs[loader, writer, reader] = resume(reader, folder, loader)
    finally:
        _reset_states()
    return runs


def _same(first: Run, second: Run) -> bool:
    return all(len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(first, second))


def _check(runs: dict[tuple[Loader, str, str], Run], loaders: list[Loader], where: str) -> None:
    for loader in loaders:
        hf_own, ref_own = runs[loader, "accelerate", "accelerate"], runs[loader, "accelerate_ref", "accelerate_ref"]
        assert _same(runs[loader, "accelerate", "accelerate_ref"], hf_own), (
            f"{where}, {loader}: accelerate_ref resumed HF's folder other than HF does"
        )
        if loader.stateful:
            expected, as_who = ref_own, "accelerate_ref does"
        else:
            expected, as_who = hf_own, "HF does from its own folder"
        assert _same(runs[loader, "accelerate_ref", "accelerate"], expected), (
            f"{where}, {loader}: HF resumed accelerate_ref's folder other than {as_who}"
        )


def _world_2(root: Path, loaders: list[Loader]) -> None:
    reports = simulators.run(crossing, world=2, args=(str(root), loaders), timeout=180, env=WORLD_2)
    for rank, runs in enumerate(reports):
        _check(runs, loaders, f"world 2, rank {rank}")


@pytest.mark.slow
def test_world_2_resumes_across_libraries(tmp_path: Path):
    _world_2(tmp_path, DEFAULT)


@pytest.mark.slow
@pytest.mark.extended
def test_world_2_resumes_across_libraries_with_the_seedable_sampler(tmp_path: Path):
    _world_2(tmp_path, SEEDABLE)


def test_world_1_resumes_across_libraries_with_the_seedable_sampler(tmp_path: Path):
    _check(crossing(str(tmp_path), SEEDABLE), SEEDABLE, "world 1")


def test_world_1_resumes_across_libraries(tmp_path: Path):
    _check(crossing(str(tmp_path), DEFAULT), DEFAULT, "world 1")


def _accelerator(impl: str, project_dir: Path, automatic: bool = True) -> tuple[Any, torch.nn.Module, Any]:
    """An Accelerator (with automatic checkpoint naming, two kept, unless told otherwise), its model and AdamW."""
    _reset_states()
    library = importlib.import_module(impl)
    naming = {"automatic_checkpoint_naming": True, "total_limit": 2} if automatic else {}
    project = library.utils.ProjectConfiguration(str(project_dir), **naming)
    accelerator = library.Accelerator(cpu=True, project_config=project)
    model = torch.nn.Linear(2, 1)
    return accelerator, *accelerator.prepare(model, torch.optim.AdamW(model.parameters()))


class Counter:
    """A registered object (`register_for_checkpointing`): its state crosses as ``custom_checkpoint_0.pkl``."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def _fill(model: torch.nn.Module, value: float) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)


def _values(model: torch.nn.Module) -> set[float]:
    return {value for parameter in model.parameters() for value in parameter.flatten().tolist()}


def test_a_project_switching_keeps_its_checkpoint_folders(tmp_path: Path):
    """HF's automatically named checkpoints (no manifest) are loaded, counted for ``total_limit`` and replaced
    by accelerate_ref, and HF loads the newest one accelerate_ref wrote. Saving to one explicit folder, each
    library replaces the other's, and accelerate_ref loads its own folder after HF saved into it in place
    (its manifest then lists files of other sizes); registered objects and ``step`` cross too."""
    try:
        hf, model, _ = _accelerator("accelerate", tmp_path)
        for value in (1.0, 2.0, 3.0):
            _fill(model, value)
            hf.save_state()
        ref, model, _ = _accelerator("accelerate_ref", tmp_path)
        ref.load_state()
        assert _values(model) == {3.0} and ref.save_iteration == 3, "the newest of HF's checkpoints loads"
        _fill(model, 4.0)
        ref.save_state()
        assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_2", "checkpoint_3"], "HF's oldest is pruned"
        hf, model, _ = _accelerator("accelerate", tmp_path)
        hf.load_state()
        assert _values(model) == {4.0}

        latest, counters = tmp_path / "latest", {impl: Counter() for impl in IMPLS}
        hf, model, _ = _accelerator("accelerate", tmp_path, automatic=False)
        hf.save_state(latest)
        ref, model, _ = _accelerator("accelerate_ref", tmp_path, automatic=False)
        ref.register_for_checkpointing(counters["accelerate_ref"])
        counters["accelerate_ref"].value, ref.step = 7, 11
        _fill(model, 5.0)
        ref.save_state(latest)  # HF's folder: replaced, not refused
        hf, model, optimizer = _accelerator("accelerate", tmp_path, automatic=False)
        hf.register_for_checkpointing(counters["accelerate"])
        hf.load_state(latest)
        assert _values(model) == {5.0} and counters["accelerate"].value == 7 and hf.step == 11
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()  # AdamW's moments: a larger optimizer.bin than accelerate_ref saved there
        expected = _values(model)
        counters["accelerate"].value, hf.step = 8, 12
        hf.save_state(latest)
        ref, model, optimizer = _accelerator("accelerate_ref", tmp_path, automatic=False)
        ref.register_for_checkpointing(counters["accelerate_ref"])
        ref.load_state(latest)
        assert _values(model) == expected and len(optimizer.state_dict()["state"]) == 2
        assert counters["accelerate_ref"].value == 8 and ref.step == 12
    finally:
        _reset_states()
