"""Reading and temporarily changing the process environment.

Catalog: env.patch_environment, env.clear_environment.
Pure standard library: `accelerate_ref.state` imports this module, so it must
not import torch or anything from `accelerate_ref` itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

_TRUE_STRINGS = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE_STRINGS = frozenset({"n", "no", "f", "false", "off", "0"})


def str_to_bool(value: str) -> int:
    """Convert a truthy/falsy string to 1 or 0.

    Rule: case-insensitive; "y", "yes", "t", "true", "on", "1" give 1 and
    "n", "no", "f", "false", "off", "0" give 0; anything else is a ValueError
    naming the value. Returns an int (not a bool), as HF accelerate does.
    Catalog: env.checks (helper of the environment flags).
    """
    lowered = value.strip().lower()
    if lowered in _TRUE_STRINGS:
        return 1
    if lowered in _FALSE_STRINGS:
        return 0
    valid = sorted(_TRUE_STRINGS | _FALSE_STRINGS)
    raise ValueError(f"Invalid truth value {value!r}; expected one of {valid}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Read the boolean flag `key` from the environment.

    Rule: an unset variable gives `default`; a set one goes through
    `str_to_bool` (so a malformed value is a ValueError, never silently False).
    Used for ACCELERATE_DEBUG_MODE and friends.
    Catalog: debug.shape_mismatch (reads ACCELERATE_DEBUG_MODE).
    """
    value = os.environ.get(key)
    if value is None:
        return default
    return str_to_bool(value) == 1


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """Return the first non-negative integer found among `env_keys`.

    Rule: keys are tried in order; unset keys and negative values are skipped;
    when none qualifies, `default` is returned.
    Catalog: env.checks.
    """
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Temporarily set environment variables.

    Rule: each keyword's name is upper-cased and its value converted with
    `str()`; on exit (also when the block raises) a variable that existed
    before gets its old value back and one that did not is removed.
    Catalog: env.patch_environment.
    """
    patched = {key.upper(): str(value) for key, value in kwargs.items()}
    previous = {key: os.environ.get(key) for key in patched}
    os.environ.update(patched)
    try:
        yield
    finally:
        for key, old_value in previous.items():
            if old_value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old_value


@contextmanager
def clear_environment() -> Iterator[None]:
    """Run a block with an empty `os.environ`.

    Rule: inside the block `os.environ` is empty; on exit (also when the
    block raises) the environment from before is restored exactly and every
    change made inside is discarded.
    Catalog: env.clear_environment.
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
