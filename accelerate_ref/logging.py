"""``get_logger``: a logger that knows the rank (catalog ``logging.get_logger``).

Rules, as 🤗 Accelerate's: each call logs on the main process only by
default; ``main_process_only=False`` logs on every rank; ``in_order=True``
logs on every rank one after another in rank order (a barrier between
turns). Every message reads ``[RANK <process index>] <message>``. Using it
before the process state exists is a ``RuntimeError``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from .state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):
    """Logger adapter whose ``log`` takes ``main_process_only`` (default True) and ``in_order`` (default False)."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        return not main_process_only or PartialState().is_main_process

    def process(self, msg: Any, kwargs: Any) -> tuple[str, Any]:
        """The message prefixed with ``[RANK <process index>]``; ``stacklevel`` 2 unless given (the caller's line)."""
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level`` where ``main_process_only``/``in_order`` say (see the module rules)."""
        if PartialState._shared_state == {}:
            raise RuntimeError(
                "You must initialize the accelerate state by calling either `PartialState()` or `Accelerator()` "
                "before using the logging utility."
            )
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        if not in_order:
            if self._should_log(main_process_only):
                self.logger.log(level, msg, *args, **kwargs)
            return
        state = PartialState()
        for turn in range(state.num_processes):
            if turn == state.process_index:
                self.logger.log(level, msg, *args, **kwargs)
                for handler in self.logger.handlers + logging.getLogger().handlers:
                    handler.flush()
            state.wait_for_everyone()

    @functools.lru_cache(None)  # noqa: B019 - the cache is the rule: once per adapter and arguments
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` that emits a given message once per logger adapter (its arguments must be hashable)."""
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """The logger ``name`` wrapped for ranks; ``log_level`` (else ``$ACCELERATE_LOG_LEVEL``, when given) sets
    its level and the root logger's."""
    if log_level is None:
        log_level = os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
