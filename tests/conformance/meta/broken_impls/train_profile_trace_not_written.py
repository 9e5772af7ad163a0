"""Broken: `profile()` ignores ``ProfileKwargs(output_trace_dir=...)``; no Chrome trace is written.

Rule: with ``output_trace_dir`` the profile is saved as a Chrome trace.
Caught at world 1 by ``profile.context``.
"""

import contextlib

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ProfileKwargs = ref.get("utils.dataclasses.ProfileKwargs")


@contextlib.contextmanager
def profile(self, profile_handler=None):
    handler = profile_handler or self.profile_handler or ProfileKwargs()
    with handler.build() as profiler:
        yield profiler


ref.replace("accelerator.Accelerator.profile", profile)
ref.export(globals())
