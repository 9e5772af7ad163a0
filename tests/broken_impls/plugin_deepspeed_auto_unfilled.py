"""Broken: a DeepSpeed config's "auto" batch size is left unfilled.

Rule: `deepspeed_config_process` fills every "auto" from the given values.
Caught by ``plugin.deepspeed_config``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils.engine_plugins.DeepSpeedPlugin.fill_match")


def fill_match(self, dotted_key, mismatches=None, must_match=True, **values):
    if dotted_key == "train_micro_batch_size_per_gpu" and self.is_auto(dotted_key):
        return None
    return original(self, dotted_key, mismatches, must_match, **values)


ref.replace("utils.engine_plugins.DeepSpeedPlugin.fill_match", fill_match)
ref.export(globals())
