"""Broken: `prepare` wraps an optimizer in a delegating proxy that is no `torch.optim.Optimizer`.

Rule: a prepared optimizer is an instance of `AcceleratedOptimizer` and of `torch.optim.Optimizer`, as in HF
1.15 (issue 20: isinstance relations). Every attribute still works, so only an isinstance check sees it.
Caught by the differential harness (`tests/conformance/tools/test_differential.py`).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


class OptimizerView:
    """Delegates every attribute to the prepared optimizer (composition instead of inheritance)."""

    def __init__(self, optimizer):
        self.__dict__["_optimizer"] = optimizer

    def __getattr__(self, name):
        return getattr(self.__dict__["_optimizer"], name)


def _proxied(original):
    def prepare_optimizer(self, *args, **kwargs):
        return OptimizerView(original(self, *args, **kwargs))

    return prepare_optimizer


ref.patch_method("accelerator.Accelerator.prepare_optimizer", _proxied)
ref.export(globals())
