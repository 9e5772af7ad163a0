"""Broken: trackers are started and logged to on every process, not on the main one only.

Rule: ``init_trackers``, ``log`` and ``end_training`` reach the trackers on
the main process only; elsewhere ``get_tracker`` returns a do-nothing
tracker. Here every process runs them as if it were the main one. Caught at
world 2 by ``tracking.init_log_end``: its custom tracker case, and its W&B
case (a second offline run); the MLflow case passes, since
`MLflowTracker`'s own methods run on the main process only.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


class _AsMain:
    """The Accelerator, claiming to be the main process (everything else is the Accelerator's)."""

    is_main_process = True

    def __init__(self, accelerator):
        self.__dict__["accelerator"] = accelerator

    def __getattr__(self, name):
        return getattr(self.__dict__["accelerator"], name)


def _on_every_process(method):
    def run(self, *args, **kwargs):
        return method(_AsMain(self), *args, **kwargs)

    return run


for _name in ("init_trackers", "log", "end_training"):
    _dotted = f"tracking.TrackingMixin.{_name}"
    ref.replace(_dotted, _on_every_process(ref.get(_dotted)))
ref.export(globals())
