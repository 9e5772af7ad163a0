"""Broken: a DeepSpeed config's "auto" batch size is left unfilled.

Rule: `deepspeed_config_process` fills every "auto" from the given values.
Caught by ``plugin.deepspeed_config``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("utils._dataclasses.deepspeed.DeepSpeedPlugin.fill_match")


def fill_match(self, ds_key_long, mismatches=None, must_match=True, **kwargs):
    if ds_key_long == "train_micro_batch_size_per_gpu" and self.is_auto(ds_key_long):
        return None
    return original(self, ds_key_long, mismatches, must_match, **kwargs)


ref.replace("utils._dataclasses.deepspeed.DeepSpeedPlugin.fill_match", fill_match)
ref.export(globals())
