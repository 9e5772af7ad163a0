"""`accelerate_ref.utils.random`: synchronising RNG states, as HF accelerate 1.15 does."""

from __future__ import annotations

import torch

from tests.side_by_side import accelerator_state_of, both_states


def test_top_level_synchronize_rng_states_matches_hf_on_one_process() -> None:
    import accelerate

    import accelerate_ref

    draws = []
    for package, module in zip((accelerate_ref, accelerate), both_states()):
        accelerator_state_of(module)
        torch.manual_seed(11)
        package.synchronize_rng_states(["torch"])  # one process: the generator is left as it is
        draws.append(torch.rand(3).tolist())
        module.AcceleratorState._reset_state(True)
    torch.manual_seed(11)
    assert draws[0] == draws[1] == torch.rand(3).tolist()
