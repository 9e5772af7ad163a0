"""Broken: the MLflow tracker drops ``step``, so every metric is recorded at step 0.

Rule: ``Accelerator.log(values, step)`` reaches each tracker with its step,
and the tracker records each value at that step. Here `MLflowTracker.log`
calls ``mlflow.log_metrics`` without it. Caught at world 2 by the
``tracking_mlflow`` case of ``tracking.init_log_end`` (the metric history
read back from MLflow's file store).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
original = ref.get("tracking.MLflowTracker.log")


def log(self, values, step=None, **kwargs):
    return original(self, values, **kwargs)


ref.replace("tracking.MLflowTracker.log", log)
ref.export(globals())
