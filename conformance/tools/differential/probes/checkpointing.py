"""Probes of ``accelerate.checkpointing``: the files ``save_accelerator_state`` and ``save_custom_state`` write (the
per-rank random states at 2 ranks and on the mock GPUs, where HF adds the CUDA generators), what the loaders
restore, and their refusals (an unknown ``map_location``, missing files, objects without a state)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from ..probe import Api, probe

AREA = "checkpointing"


class _Counter:
    """A registered-object stand-in: a state dict of plain values."""

    def __init__(self, count: int = 0) -> None:
        self.count = count

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


class _Holder(_Counter):
    """A state holding a Python object, which loading with ``weights_only=True`` refuses."""

    def state_dict(self) -> dict:
        return {"count": _Counter(self.count)}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"].count


def _training_objects(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """A model, an SGD optimizer with momentum (so it has state after a step) and a StepLR, after one step."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _restored(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler) -> dict:
    return {"weights": dict(model.state_dict()), "momentum": [optimizer.state[p]["momentum_buffer"]
                                                               for p in model.parameters() if p in optimizer.state],
            "lr": scheduler.get_last_lr()}


@probe(AREA, worlds=(1, 2), families=("cpu", "cuda"))
def save_accelerator_state(api: Api) -> None:
    api.partial_state()
    save = "checkpointing.save_accelerator_state"
    model, optimizer, scheduler = _training_objects(0)
    for folder in ("safe", "pickled", "refused"):  # HF writes into a folder that exists (save_state makes it)
        os.makedirs(folder, exist_ok=True)
    api.call("safetensors", save, "safe", [model.state_dict()], [optimizer], [scheduler], [], api.rank, 7)
    other, other_optimizer, other_scheduler = _training_objects(1)
    api.call("pickle, two of each, a scaler", save, "pickled", [model.state_dict(), other.state_dict()],
             [optimizer, other_optimizer], [scheduler, other_scheduler], [], api.rank, 8,
             scaler=torch.amp.GradScaler("cpu"), safe_serialization=False)
    api.call("a path object", lambda: os.fspath(api.get(save)(api.tmp / "safe", [], [], [], [], api.rank, 9)))
    api.call("an optimizer without a state", save, "refused", [], [object()], [], [], api.rank, 0)
    api.call("into a missing folder", save, "missing/folder", [model.state_dict()], [], [], [], api.rank, 0,
             safe_serialization=False)


@probe(AREA)
def load_accelerator_state(api: Api) -> None:
    api.partial_state()
    load = "checkpointing.load_accelerator_state"
    model, optimizer, scheduler = _training_objects(0)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    os.makedirs("ckpt"), os.makedirs("pickled")
    api.get("checkpointing.save_accelerator_state")("ckpt", [model.state_dict()], [optimizer], [scheduler], [], 0, 7,
                                                     scaler=torch.amp.GradScaler("cpu"))
    fresh, fresh_optimizer, fresh_scheduler = _training_objects(3)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    api.call("everything", load, "ckpt", [fresh], [fresh_optimizer], [fresh_scheduler], [], 0, scaler=scaler)
    api.record("restored", _restored(fresh, fresh_optimizer, fresh_scheduler))
    api.record("scaler", scaler.state_dict())
    api.record("draws after (seeded 5 when saved)", (random.random(), float(np.random.rand()), torch.rand(2)))
    for location in ("cpu", "on_device"):
        api.call(f"map_location={location}", load, "ckpt", [], [fresh_optimizer], [], [], 0, map_location=location)
    api.call("an unknown map_location", load, "ckpt", [], [], [], [], 0, map_location="gpu")
    api.call("a model with other keys", load, "ckpt", [torch.nn.Linear(2, 3)], [], [], [], 0)
    api.call("a model, not strict", load, "ckpt", [torch.nn.Sequential(torch.nn.Linear(2, 2))], [], [], [], 0,
             strict=False)
    api.get("checkpointing.save_accelerator_state")("pickled", [model.state_dict()], [], [], [], 0, 1,
                                                     safe_serialization=False)
    api.call("a pickled model", load, "pickled", [fresh], [], [], [], 0)
    api.call("weights_only refused by load_kwargs", load, "ckpt", [], [fresh_optimizer], [], [], 0,
             load_kwargs={"weights_only": True})
    api.call("another process's random states", load, "ckpt", [], [], [], [], 1)
    os.makedirs("empty")
    api.call("an empty folder", load, "empty", [fresh], [], [], [], 0)
    api.call("no optimizer file", load, "pickled", [], [fresh_optimizer], [], [], 0)


@probe(AREA, worlds=(1, 2))
def save_custom_state(api: Api) -> None:
    api.partial_state()
    save = "checkpointing.save_custom_state"
    os.makedirs("custom", exist_ok=True)
    api.call("an object", save, _Counter(4), "custom")
    api.call("an index", save, _Counter(5), "custom", 2)
    api.call("on each node", save, _Counter(6), "custom", 3, save_on_each_node=True)
    api.call("without a state_dict", save, object(), "custom", 4)
    api.call("into a missing folder", save, _Counter(7), "missing", 0)


@probe(AREA)
def load_custom_state(api: Api) -> None:
    api.partial_state()
    load = "checkpointing.load_custom_state"
    os.makedirs("custom", exist_ok=True)
    api.get("checkpointing.save_custom_state")(_Counter(4), "custom")
    api.get("checkpointing.save_custom_state")(_Holder(9), "custom", 1)
    counter = _Counter()
    api.call("an object", load, counter, "custom")
    api.record("count", counter.count)
    holder = _Holder()
    api.call("a state holding an object", load, holder, "custom", 1)
    api.record("holder count", holder.count)
    api.call("a missing index", load, _Counter(), "custom", 5)
    api.call("without load_state_dict", load, object(), "custom")
