"""Broken: under DeepSpeed, ``load_state`` restores the engine's model but not its optimizer state.

Rule: `save_state` / `load_state` go through the engine's own checkpointing,
which holds the ZeRO optimizer partitions (Adam's moments and step count)
too, so training after `load_state` follows the uninterrupted run bit for
bit. Caught at world 2 by the ``plugin.deepspeed_zero`` case
``plugin_deepspeed_save_state`` (where the deepspeed package is installed).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.deepspeed.load_engine_checkpoint")


def load_engine_checkpoint(engine, input_dir, index, **load_kwargs):
    original(engine, input_dir, index, **{**load_kwargs, "load_optimizer_states": False})


ref.replace("utils.deepspeed.load_engine_checkpoint", load_engine_checkpoint)
ref.export(globals())
