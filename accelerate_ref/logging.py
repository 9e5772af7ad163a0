"""``get_logger``: a logger that knows the rank (catalog ``logging.get_logger``).

Each call logs on the main process only by default; ``main_process_only=False``
logs on every rank; ``in_order=True`` logs on every rank one after another in
rank order (a barrier between turns). Using it before the process state exists
is a ``RuntimeError``, as in 🤗 Accelerate.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):
    """Logger adapter whose ``log`` takes ``main_process_only`` (default True) and ``in_order`` (default False)."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        return not main_process_only or PartialState().is_main_process

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if not PartialState._shared_state:
            raise RuntimeError("create an Accelerator or PartialState before using a logger from get_logger")
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if not in_order:
            if self._should_log(main_process_only):
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
            return
        state = PartialState()
        for turn in range(state.num_processes):
            if turn == state.process_index:
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
                for handler in self.logger.handlers + logging.getLogger().handlers:
                    handler.flush()
            state.wait_for_everyone()

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that emits a given message once per logger."""
        key = (args, tuple(sorted(kwargs.items())))
        seen = self.__dict__.setdefault("_warned", set())
        if key not in seen:
            seen.add(key)
            self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """The logger ``name`` wrapped for ranks; ``log_level`` (else ``$ACCELERATE_LOG_LEVEL``) sets its level."""
    log_level = log_level or os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
