"""Seeding and synchronising random number generators across processes.

`set_seed` makes a run reproducible; `synchronize_rng_states` gives every
process the RNG state of process 0, which is how prepared data loaders
shuffle identically on every rank (so that their shards stay disjoint).

`PartialState` and the collectives are imported inside functions:
`accelerate_ref.state` imports `accelerate_ref.utils`, and a module-level
import would be a cycle.

Catalog: seed.set_seed, data.shuffle_sync, data.seedable_sampler.
"""

from __future__ import annotations

import random
from typing import Callable, Optional, Union

import numpy as np
import torch

from .constants import CUDA_DISTRIBUTED_TYPES  # noqa: F401  (HF's utils.random exposes it)
from .dataclasses import RNGType

StateAccessors = tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], None]]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed `random`, `numpy` and `torch` (every device torch knows of) with ``seed``.

    Rule: after `set_seed(s)` the same code draws the same numbers from all
    three libraries; with ``device_specific=True`` process ``i`` uses
    ``s + i`` instead, so that ranks draw different numbers reproducibly;
    ``deterministic=True`` also turns on torch's deterministic algorithms.
    Catalog: seed.set_seed.
    """
    if device_specific:
        from ..state import PartialState

        seed += PartialState().process_index
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CPU and every accelerator torch has loaded
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _state_accessors(rng_type: RNGType, generator: Optional[torch.Generator]) -> StateAccessors:
    """The getter and setter of the RNG state that ``rng_type`` names."""
    if rng_type == RNGType.TORCH:
        return torch.get_rng_state, torch.set_rng_state
    if rng_type == RNGType.GENERATOR:
        if generator is None:
            raise ValueError('synchronizing the "generator" RNG needs the torch.Generator to synchronize')
        return generator.get_state, generator.set_state
    if rng_type == RNGType.XLA:
        raise NotImplementedError('synchronizing the "xla" RNG is not implemented in accelerate_ref yet')
    device_module = getattr(torch, rng_type.value, None)
    if device_module is None or not device_module.is_available():
        raise RuntimeError(f'cannot synchronize the "{rng_type.value}" RNG: no {rng_type.value} device is available')
    return device_module.get_rng_state, device_module.set_rng_state


def synchronize_rng_state(
    rng_type: Union[str, RNGType, None] = None, generator: Optional[torch.Generator] = None
) -> None:
    """Give every process the state process 0 has of one random number generator.

    Rule: ``"torch"`` is torch's global CPU RNG, ``"generator"`` the given
    ``generator``, ``"cuda"`` (or another device name of `RNGType`) that
    device's RNG. The state is broadcast from process 0 (through the
    current device, so it works on every backend); a single process keeps
    its own. Catalog: data.shuffle_sync.
    """
    from ..state import PartialState
    from .operations import broadcast

    get_state, set_state = _state_accessors(RNGType(rng_type), generator)
    state = get_state()
    shared = broadcast(state.to(PartialState().device), from_process=0)
    set_state(shared.cpu())


def synchronize_rng_states(
    rng_types: list[Union[str, RNGType]], generator: Optional[torch.Generator] = None
) -> None:
    """`synchronize_rng_state` for each of ``rng_types``, in order.

    Prepared data loaders call it at the start of every epoch with their
    ``rng_types`` (``["generator"]`` by default under an `Accelerator`).
    Catalog: data.shuffle_sync.
    """
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)
