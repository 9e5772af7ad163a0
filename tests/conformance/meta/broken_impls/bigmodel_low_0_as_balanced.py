"""Broken: ``load_checkpoint_and_dispatch(device_map="balanced_low_0")`` balances as ``"balanced"`` does.

Rule (bigmodel.load_checkpoint_and_dispatch; HF's strategies): ``"balanced_low_0"`` keeps accelerator 0 as
light as it can (generation's outputs land there), so it holds less than under ``"balanced"``. Here the
strategy is read as ``"balanced"``. Caught on ``sim-npu`` by ``load_and_dispatch_npus`` (a surviving mutant
of the strategy's test, issue 24).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("big_modeling.load_checkpoint_and_dispatch")


def load_checkpoint_and_dispatch(model, checkpoint, device_map=None, *args, **kwargs):
    return original(model, checkpoint, "balanced" if device_map == "balanced_low_0" else device_map, *args, **kwargs)


ref.replace("big_modeling.load_checkpoint_and_dispatch", load_checkpoint_and_dispatch)
ref.export(globals())
