"""Broken: `register_for_checkpointing` refuses an object without `state_dict` in its own words, not HF's.

Rule: a refusal has HF 1.15's exception type and message text (issue 20, "Bad input").
Caught by the differential harness (`tests/conformance/tools/test_differential.py`), not by a catalog case.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def _reworded(original):
    def register_for_checkpointing(self, *objects):
        try:
            return original(self, *objects)
        except ValueError:
            raise ValueError("every object needs state_dict and load_state_dict") from None

    return register_for_checkpointing


ref.patch_method("accelerator.Accelerator.register_for_checkpointing", _reworded)
ref.export(globals())
