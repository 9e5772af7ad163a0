"""Broken: trackers are started and logged to on every process, not on the main one only.

Rule: ``init_trackers``, ``log`` and ``end_training`` reach the trackers on
the main process only; elsewhere ``get_tracker`` returns a do-nothing
tracker. Here every process starts its trackers and logs. Caught at world 2
by ``tracking.init_log_end``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def init_trackers(self, project_name, config=None, init_kwargs=None):
    for tracker in self.log_with:
        self.trackers.append(tracker)
        tracker.start()
        if config is not None:
            tracker.store_init_configuration(config)


def log(self, values, step=None, log_kwargs=None):
    for tracker in self.trackers:
        tracker.log(values, step=step)


def end_training(self):
    for tracker in self.trackers:
        tracker.finish()
    self.state.destroy_process_group()


ref.replace("tracking.TrackingMixin.init_trackers", init_trackers)
ref.replace("tracking.TrackingMixin.log", log)
ref.replace("tracking.TrackingMixin.end_training", end_training)
ref.export(globals())
