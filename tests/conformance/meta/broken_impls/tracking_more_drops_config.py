"""Broken: the Comet, Aim, ClearML and DVCLive trackers drop the run's configuration.

Rule: ``init_trackers(project, config)`` hands ``config`` to each tracker's
``store_init_configuration``, and the tracker records it in its store (Comet
parameters, Aim's ``hparams``, ClearML's connected configuration, DVCLive's
``params.yaml``). Here those four trackers' ``store_init_configuration`` do
nothing. Caught at world 2 by the ``tracking_comet_ml``, ``tracking_aim``,
``tracking_clearml`` and ``tracking_dvclive`` cases of
``tracking.init_log_end`` (each reads its package's own store back).
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def store_init_configuration(self, values):
    return None


for _class in ("CometMLTracker", "AimTracker", "ClearMLTracker", "DVCLiveTracker"):
    ref.replace(f"_tracking.trackers.{_class}.store_init_configuration", store_init_configuration)
ref.export(globals())
