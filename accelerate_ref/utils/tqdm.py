"""``tqdm`` that draws on the main process of each machine only (🤗 Accelerate's wrapper; no catalog ID).

``tqdm(*args, main_process_only=True, **kwargs)`` is ``tqdm.auto.tqdm`` with ``disable``
set on every process whose local index is not 0 (``disable=True`` always wins). A bool
as the first positional argument (the pre-1.0 ``tqdm(main_process_only, iterable)``
order) is refused with a ValueError, as 🤗 Accelerate refuses it.
"""

from __future__ import annotations

from .imports import is_tqdm_available


def tqdm(*args, main_process_only: bool = True, **kwargs):
    if not is_tqdm_available():
        raise ImportError("accelerate_ref's `tqdm` needs the `tqdm` package: pip install tqdm")
    if args and isinstance(args[0], bool):
        raise ValueError("tqdm's first argument is the iterable: pass main_process_only as a keyword argument")
    from tqdm.auto import tqdm as auto_tqdm

    from ..state import PartialState

    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = PartialState().local_process_index != 0
    return auto_tqdm(*args, **kwargs, disable=disable)
