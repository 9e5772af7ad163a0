"""Probes of ``accelerate.utils.random``: ``set_seed`` (per device, deterministic) and the synchronisation of
random generators across ranks, with every generator type and the refusals."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..probe import Api, probe

AREA = "utils.random"


def _draws() -> dict:
    """The next value of each generator ``set_seed`` seeds."""
    return {"random": random.random(), "numpy": float(np.random.rand()), "torch": torch.rand(2)}


@probe(AREA)
def set_seed_before_any_state(api: Api) -> None:
    api.call("set_seed(3)", "utils.random.set_seed", 3)
    api.record("draws", _draws())
    api.call("device_specific", "utils.random.set_seed", 3, device_specific=True)
    api.record("device_specific draws", _draws())
    api.call("a seed that is not an int", "utils.random.set_seed", "3")
    api.call("a negative seed", "utils.random.set_seed", -1)


@probe(AREA)
def with_a_partial_state_only(api: Api) -> None:
    """``set_seed(device_specific=True)`` and the synchronisations read ``AcceleratorState()``, which a
    ``PartialState`` alone does not make."""
    api.partial_state()
    api.call("set_seed device_specific", "utils.random.set_seed", 3, device_specific=True)
    api.record("draws", _draws())
    api.call("synchronize_rng_state torch", "utils.random.synchronize_rng_state",
             api.get("utils.dataclasses.RNGType").TORCH)
    api.call("synchronize_rng_states", "utils.random.synchronize_rng_states", ["torch"])


@probe(AREA, worlds=(1, 2), families=("cpu", "cuda"))
def set_seed(api: Api) -> None:
    api.accelerator()
    for label, kwargs in (("plain", {}), ("device_specific", {"device_specific": True})):
        api.call(label, "utils.random.set_seed", 42, **kwargs)
        api.record(f"{label}: draws", _draws())
    try:
        api.call("deterministic", "utils.random.set_seed", 42, deterministic=True)
        api.observe("deterministic algorithms", torch.are_deterministic_algorithms_enabled)
    finally:
        torch.use_deterministic_algorithms(False)


@probe(AREA, worlds=(1, 2), families=("cpu", "cuda"))
def synchronize_rng_state(api: Api) -> None:
    api.accelerator()
    sync = "utils.random.synchronize_rng_state"
    rng_type = api.get("utils.dataclasses.RNGType")
    torch.manual_seed(100 + api.rank)
    api.call("torch", sync, rng_type.TORCH)
    api.record("torch draws after", torch.rand(3))
    generator = torch.Generator().manual_seed(200 + api.rank)
    api.call("generator", sync, rng_type.GENERATOR, generator=generator)
    api.record("generator draws after", torch.rand(3, generator=generator))
    api.call("generator missing", sync, rng_type.GENERATOR)
    api.call("cuda", sync, rng_type.CUDA)
    for name in ("XLA", "NPU", "MLU", "SDAA", "MUSA", "XPU", "HPU", "NEURON"):
        api.call(name.lower(), sync, getattr(rng_type, name))
    api.call("no type", sync)
    api.call("a string type", sync, "torch")


@probe(AREA, worlds=(1, 2))
def synchronize_rng_states(api: Api) -> None:
    api.accelerator()
    sync = "utils.random.synchronize_rng_states"
    torch.manual_seed(300 + api.rank)
    generator = torch.Generator().manual_seed(400 + api.rank)
    api.call("torch and generator by name", sync, ["torch", "generator"], generator=generator)
    api.record("draws after", {"torch": torch.rand(2), "generator": torch.rand(2, generator=generator)})
    api.call("an RNGType", sync, [api.get("utils.dataclasses.RNGType").TORCH])
    api.call("none", sync, [])
    api.call("an unknown name", sync, ["torch", "bogus"])
    api.call("generator without one", sync, ["generator"])
