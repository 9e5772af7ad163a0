"""Reading and temporarily changing the process environment.

Catalog: env.patch_environment, env.clear_environment.
Pure standard library: `accelerate_ref.state` imports this module, so it must
not import torch or anything from `accelerate_ref` itself.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

_logger = logging.getLogger(__name__)

_TRUE_STRINGS = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE_STRINGS = frozenset({"n", "no", "f", "false", "off", "0"})


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """Convert a truthy/falsy string to 1 or 0 (``True``/``False`` with ``to_bool``).

    Rule: case-insensitive; "y", "yes", "t", "true", "on", "1" give 1 and
    "n", "no", "f", "false", "off", "0" give 0; anything else is a ValueError
    naming the value. Returns an int (not a bool) unless ``to_bool``, as HF accelerate does.
    Catalog: env.checks (helper of the environment flags).
    """
    lowered = value.strip().lower()
    if lowered in _TRUE_STRINGS:
        return True if to_bool else 1
    if lowered in _FALSE_STRINGS:
        return False if to_bool else 0
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


# --------------------------------------------------------------------------
# The remaining helpers of accelerate 1.15's `utils.environment` (catalog env.checks,
# env.patch_environment): same names and parameters.
# --------------------------------------------------------------------------
_FORBIDDEN_ENV_CHARACTERS = (";", "\n", "<", ">", " ")
_ACCELERATE_PREFIX = "ACCELERATE_"
_Wrapped = TypeVar("_Wrapped")


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The raw value of ``key`` in the environment, else ``str(default)``. Catalog: env.checks."""
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among ``library_names`` already imported in this process. Catalog: env.checks."""
    return [name for name in library_names if name in sys.modules]


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``["KEY=value\\n", ...]`` for the items safe to write to an environment file.

    Rule: an item whose key or value is empty or contains ``;``, a newline, ``<``,
    ``>`` or a space is skipped with a warning (it could inject a command).
    Catalog: env.checks.
    """
    lines = []
    for key, value in current_env.items():
        text = key + value
        if key and value and not any(char in text for char in _FORBIDDEN_ENV_CHARACTERS):
            lines.append(f"{key}={value}\n")
        else:
            _logger.warning(f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values.")
    return lines


@contextmanager
def _accelerate_variables_restored() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(_ACCELERATE_PREFIX)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_ACCELERATE_PREFIX)]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(function, "_accelerate_is_purged_environment_wrapped", False):
        return function

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _accelerate_variables_restored():
            return function(*args, **kwargs)

    wrapper._accelerate_is_purged_environment_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def purge_accelerate_environment(func_or_cls: _Wrapped) -> _Wrapped:
    """Decorator: the ``ACCELERATE_*`` variables a call sets (or changes) are undone when it returns.

    Rule: on a function, each call restores every ``ACCELERATE_*`` variable to its
    value before the call and removes new ones, even when the call raises. On a
    class, every ``test*`` method is wrapped so, including those of subclasses
    (test classes of unittest or pytest). Catalog: env.patch_environment.
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)  # type: ignore[arg-type,return-value]
    cls = func_or_cls

    def wrap_tests(klass: type) -> None:
        for name in dir(klass):
            method = getattr(klass, name)
            if name.startswith("test") and callable(method):
                setattr(klass, name, _purging(method))

    wrap_tests(cls)
    parent_hook = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(subclass: type, **kwargs: Any) -> None:
        if parent_hook is not None:
            parent_hook.__func__(subclass, **kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)
        wrap_tests(subclass)

    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    return cls  # type: ignore[return-value]


@dataclass
class CPUInformation:
    """Rank, world size, local rank and local world size of a CPU-distributed process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def get_cpu_distributed_information() -> CPUInformation:
    """The CPU launch's ranks, read from torchrun's or an MPI launcher's variables.

    Rule: each field is the first of torchrun's, Intel MPI's, Open MPI's and
    MVAPICH's variables that is set, else rank 0 of a one-process world.
    Catalog: env.checks.
    """
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(
            ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"], 1),
    )


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type name)`` of this machine's accelerator, without initialising it.

    Rule: the first available of MLU, SDAA, MUSA, NPU, HPU, XPU, Neuron, else
    ``("cuda", "MULTI_GPU")``. Catalog: env.checks.
    """
    from . import imports

    for device, check in (("mlu", imports.is_mlu_available), ("sdaa", imports.is_sdaa_available),
                          ("musa", imports.is_musa_available), ("npu", imports.is_npu_available),
                          ("hpu", imports.is_hpu_available), ("xpu", imports.is_xpu_available),
                          ("neuron", imports.is_neuron_available)):
        if check():
            return device, f"MULTI_{device.upper()}"
    return "cuda", "MULTI_GPU"
