"""Broken: ``load_state`` gives every process the RNG states process 0 saved.

Rule: each process saves and restores its own ``random_states_<rank>.pkl``,
so per-process random streams (dropout with ``set_seed(...,
device_specific=True)``) continue where each left off. Here every process
loads ``random_states_0.pkl``. Caught at world 2 by ``save_state.roundtrip``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("checkpointing.load_accelerator_state")


def load_accelerator_state(input_dir, models, optimizers, schedulers, dataloaders, process_index, *args, **kwargs):
    return original(input_dir, models, optimizers, schedulers, dataloaders, 0, *args, **kwargs)


ref.replace("checkpointing.load_accelerator_state", load_accelerator_state)
ref.export(globals())
