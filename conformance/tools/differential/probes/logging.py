"""Probes of ``accelerate.logging``: `get_logger` and its `MultiProcessAdapter` (main process only by default,
``main_process_only=False``, ``in_order=True``, ``warning_once``), the refusal before the process state exists,
and the levels ``log_level`` and ``ACCELERATE_LOG_LEVEL`` set.

The loggers are named under the implementation's package (``<package>.probe...``) so the harness records
their messages; the levels `get_logger` sets (its logger's and the root logger's) are restored after each probe.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from ..probe import Api, probe


@contextlib.contextmanager
def levels_kept(api: Api, *suffixes: str) -> Iterator[list[str]]:
    """The names ``<package>.probe.<suffix>``; their loggers' levels and the root's restored after the block."""
    names = [f"{api.module.__name__}.probe.{suffix}" for suffix in suffixes]
    saved = {name: logging.getLogger(name).level for name in names}
    root = logging.getLogger().level
    try:
        yield names
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
        logging.getLogger().setLevel(root)


def levels(names: list[str]) -> dict[str, Any]:
    """The level of each logger and of the root logger, by name."""
    return {**{name.rpartition(".")[2]: logging.getLogger(name).level for name in names},
            "root": logging.getLogger().level}


@probe("logging")
def before_the_state_exists(api: Api) -> None:
    with levels_kept(api, "early") as (name,):
        logger = api.call("get_logger", "logging.get_logger", name, "INFO")
        api.observe("info", logger.info, "too early")
        api.observe("debug below the level", logger.debug, "too early")
        api.observe("warning_once", logger.warning_once, "too early")
        api.partial_state()
        api.observe("info once the state exists", logger.info, "now")


@probe("logging")
def log_levels(api: Api) -> None:
    api.partial_state()
    with levels_kept(api, "default", "info", "lower", "bad", "empty") as names:
        default, info, lower, bad, empty = names
        logger = api.call("no level", "logging.get_logger", default)
        api.observe("info at the root's level", logger.info, "hidden")
        api.observe("warning at the root's level", logger.warning, "shown")
        api.record("levels after no level", levels(names))
        logger = api.call("INFO", "logging.get_logger", info, log_level="INFO")
        api.observe("info at INFO", logger.info, "shown %s", "with args")
        api.observe("debug at INFO", logger.debug, "hidden")
        api.record("levels after INFO", levels(names))
        logger = api.call("lower case", "logging.get_logger", lower, log_level="debug")
        api.observe("debug at debug", logger.debug, "shown")
        api.observe("isEnabledFor", logger.isEnabledFor, logging.DEBUG)
        api.observe("getEffectiveLevel", logger.getEffectiveLevel)
        api.record("levels after debug", levels(names))
        api.call("an unknown level", "logging.get_logger", bad, log_level="loud")
        api.call("an empty level", "logging.get_logger", empty, log_level="")
        api.call("a number", "logging.get_logger", empty, log_level=10)
        api.record("levels at the end", levels(names))


@probe("logging", env={"ACCELERATE_LOG_LEVEL": "debug"})
def log_level_from_the_environment(api: Api) -> None:
    api.partial_state()
    with levels_kept(api, "from_env", "argument") as names:
        logger = api.call("get_logger", "logging.get_logger", names[0])
        api.observe("debug", logger.debug, "shown")
        api.record("levels", levels(names))
        logger = api.call("an argument wins", "logging.get_logger", names[1], "ERROR")
        api.observe("warning below the argument's level", logger.warning, "hidden")
        api.observe("error", logger.error, "shown")
        api.record("levels after the argument", levels(names))


@probe("logging", worlds=(1, 2))
def main_process_only_and_in_order(api: Api) -> None:
    api.partial_state()
    with levels_kept(api, "ranks") as (name,):
        logger = api.get("logging.get_logger")(name, "INFO")
        api.observe("info", logger.info, "rank %d", api.rank)
        api.observe("main_process_only=True", logger.info, "main", main_process_only=True)
        api.observe("main_process_only=False", logger.info, "every rank %d", api.rank, main_process_only=False)
        api.observe("in_order", logger.warning, "in order %d", api.rank, in_order=True)
        api.observe("in_order wins over main_process_only", logger.error, "both", in_order=True, main_process_only=True)
        api.observe("in_order below the level", logger.debug, "hidden", in_order=True)
        api.observe("log with a level", logger.log, logging.ERROR, "error %s", "text", main_process_only=False)
        api.observe("an extra", logger.info, "extra", extra={"key": "value"})
        api.observe("a stacklevel", logger.info, "stacklevel", stacklevel=1)
        api.observe("exception", logger.exception, "failed")
        api.observe("critical", logger.critical, "critical")
        api.observe("an unknown keyword", logger.info, "bad", colour="blue")


@probe("logging", worlds=(1, 2))
def warning_once(api: Api) -> None:
    api.partial_state()
    with levels_kept(api, "once") as (name,):
        logger = api.get("logging.get_logger")(name)
        api.observe("first", logger.warning_once, "said once %s", "here")
        api.observe("again", logger.warning_once, "said once %s", "here")
        api.observe("other arguments", logger.warning_once, "said once %s", "there")
        api.observe("on every rank", logger.warning_once, "every rank", main_process_only=False)
        api.observe("on every rank again", logger.warning_once, "every rank", main_process_only=False)
        api.observe("an unhashable argument", logger.warning_once, "list %s", [1])
        again = api.get("logging.get_logger")(name)
        api.observe("another adapter of the same logger", again.warning_once, "said once %s", "here")


@probe("logging", worlds=(1, 2))
def multi_process_adapter(api: Api) -> None:
    adapter_class = api.get("logging.MultiProcessAdapter")
    with levels_kept(api, "adapter") as (name,):
        adapter = api.observe("create", adapter_class, logging.getLogger(name), {"a": 1})
        api.partial_state()
        api.observe("process", adapter.process, "message", {})
        api.observe("process keeps a stacklevel", adapter.process, "message", {"stacklevel": 5, "extra": {"b": 2}})
        api.observe("warning", adapter.warning, "from the adapter")
        api.record("a LoggerAdapter", isinstance(adapter, logging.LoggerAdapter))
