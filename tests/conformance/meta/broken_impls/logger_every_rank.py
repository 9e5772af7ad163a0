"""Broken: `get_logger(...).info(...)` logs on every rank (``main_process_only`` ignored).

Rule: a logger from ``get_logger`` logs on the main process only by default. Caught at world 2 by
``logging.get_logger``.
"""

from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)
ref.replace("logging.MultiProcessAdapter._should_log", staticmethod(lambda main_process_only: True))
ref.export(globals())
