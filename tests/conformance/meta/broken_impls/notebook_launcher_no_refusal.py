"""Broken: `notebook_launcher` does not refuse an Accelerator created before the call.

Rule: the Accelerator must be created inside the function; one created before is refused with a
clear error. Caught at world 2 by ``launch.notebook_launcher``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.replace("launchers._state_exists", lambda: False)
ref.export(globals())
