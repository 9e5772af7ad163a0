"""Seeding and synchronising random number generators across processes.

`set_seed` makes a run reproducible; `synchronize_rng_states` gives every
process the RNG state of process 0, which is how prepared data loaders
shuffle identically on every rank (so that their shards stay disjoint).

Both read `AcceleratorState()` as HF 1.15 does, so outside an `Accelerator`
(`set_seed(device_specific=True)`, a synchronisation) they raise its
ValueError "Please make sure to properly initialize your accelerator ...".
`AcceleratorState` and the collectives are imported inside functions:
`accelerate_ref.state` imports `accelerate_ref.utils`, and a module-level
import would be a cycle.

Catalog: seed.set_seed, data.shuffle_sync, data.seedable_sampler.
"""

from __future__ import annotations

import importlib
import random
from typing import Callable, Optional, Union

import numpy as np
import torch

from .constants import CUDA_DISTRIBUTED_TYPES  # noqa: F401  (HF's utils.random exposes it)
from .dataclasses import DistributedType, RNGType
from .imports import (
    is_hpu_available,
    is_mlu_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_sdaa_available,
    is_torch_xla_available,
    is_xpu_available,
)

#: The out-of-tree device RNGs: the check that the device is there, and HF 1.15's words when it is not.
_DEVICE_RNGS: dict[RNGType, tuple[Callable[[], bool], str]] = {
    RNGType.NPU: (is_npu_available, "Can't synchronize NPU seeds on an environment without NPUs."),
    RNGType.MLU: (is_mlu_available, "Can't synchronize MLU seeds on an environment without MLUs."),
    RNGType.SDAA: (is_sdaa_available, "Can't synchronize SDAA seeds on an environment without SDAAs."),
    RNGType.MUSA: (is_musa_available, "Can't synchronize MUSA seeds on an environment without MUSAs."),
    RNGType.XPU: (is_xpu_available, "Can't synchronize XPU seeds on an environment without XPUs."),
    RNGType.HPU: (is_hpu_available, "Can't synchronize HPU seeds on an environment without HPUs."),
    RNGType.NEURON: (is_neuron_available, "Can't synchronize Neuron seeds on an environment without Neuron Cores."),
}


def _xla_model():
    """``torch_xla.core.xla_model`` (imported when first needed: only XLA worlds have it)."""
    return importlib.import_module("torch_xla.core.xla_model")


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed `random`, `numpy` and `torch` (every device torch knows of, and XLA's RNG) with ``seed``.

    Rule: after `set_seed(s)` the same code draws the same numbers from all
    three libraries; with ``device_specific=True`` process ``i`` uses
    ``s + i`` instead, so that ranks draw different numbers reproducibly
    (``i`` is ``AcceleratorState().process_index``: without an `Accelerator`
    that is its ValueError and nothing is seeded); ``deterministic=True``
    also turns on torch's deterministic algorithms.
    Catalog: seed.set_seed.
    """
    if device_specific:
        from ..state import AcceleratorState

        seed += AcceleratorState().process_index
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU and every accelerator torch has loaded
    if is_torch_xla_available():
        _xla_model().set_rng_state(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _read_state(rng_type: object, generator: Optional[torch.Generator]) -> Optional[torch.Tensor]:
    """The state of the RNG ``rng_type`` names, or None when it is no `RNGType` member (HF compares members only).

    A device that is missing is an AssertionError in HF's words; CUDA's is
    torch's own (``torch.cuda.get_rng_state()`` is read as it is).
    """
    if rng_type == RNGType.TORCH:
        return torch.get_rng_state()
    if rng_type == RNGType.CUDA:
        return torch.cuda.get_rng_state()
    if rng_type == RNGType.XLA:
        if not is_torch_xla_available():
            raise AssertionError("Can't synchronize XLA seeds as torch_xla is unavailable.")
        return torch.tensor(_xla_model().get_rng_state())
    if rng_type in _DEVICE_RNGS:
        available, missing = _DEVICE_RNGS[rng_type]
        if not available():
            raise AssertionError(missing)
        return getattr(torch, rng_type.value).get_rng_state()
    if rng_type == RNGType.GENERATOR:
        if generator is None:
            raise AssertionError("Need a generator to synchronize its seed.")
        return generator.get_state()
    return None


def _write_state(rng_type: RNGType, state: torch.Tensor, generator: Optional[torch.Generator]) -> None:
    """Set the RNG ``rng_type`` names to ``state`` (a CPU tensor; XLA's RNG takes its one number)."""
    if rng_type == RNGType.TORCH:
        torch.set_rng_state(state)
    elif rng_type == RNGType.GENERATOR:
        generator.set_state(state)
    elif rng_type == RNGType.XLA:
        _xla_model().set_rng_state(state.item())
    else:
        getattr(torch, rng_type.value).set_rng_state(state)


def synchronize_rng_state(rng_type: Optional[RNGType] = None, generator: Optional[torch.Generator] = None) -> None:
    """Give every process the state process 0 has of one random number generator.

    Rule: `RNGType.TORCH` is torch's global CPU RNG, `RNGType.GENERATOR` the
    given ``generator``, `RNGType.CUDA` (or another device member) that
    device's RNG. The state is broadcast from process 0 (through the
    current device, so it works on every backend) whenever the world is
    distributed; a single process keeps its own. Anything but an `RNGType`
    member (None, a string: use `synchronize_rng_states` for names) names
    no RNG: a single process does nothing, and a distributed world, which
    has nothing to broadcast, raises ValueError (HF 1.15 fails there with
    an UnboundLocalError, see DIFFERENTIAL.toml). Catalog: data.shuffle_sync.
    """
    from ..state import AcceleratorState
    from .operations import broadcast

    state = _read_state(rng_type, generator)
    accelerator_state = AcceleratorState()
    if accelerator_state.distributed_type == DistributedType.NO:
        return
    if state is None:
        raise ValueError(f"synchronize_rng_state needs an RNGType member to synchronize, not {rng_type!r}")
    shared = broadcast(state.to(accelerator_state.device), from_process=0)
    _write_state(rng_type, shared.cpu(), generator)


def synchronize_rng_states(
    rng_types: list[Union[str, RNGType]], generator: Optional[torch.Generator] = None
) -> None:
    """`synchronize_rng_state` for each of ``rng_types`` (names or members), in order.

    Prepared data loaders call it at the start of every epoch with their
    ``rng_types`` (``["generator"]`` by default under an `Accelerator`);
    an unknown name is `RNGType`'s ValueError. Catalog: data.shuffle_sync.
    """
    for rng_type in rng_types:
        synchronize_rng_state(RNGType(rng_type), generator=generator)
