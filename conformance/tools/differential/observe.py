"""What a call did, as plain data two implementations can be compared on.

Rules:

* a value is described by what a user can see of it: a tensor by dtype,
  device, shape and its exact bytes (values for small ones), a container
  recursively, an enum by class name and value, a dataclass by its fields, a
  class by its public name, any other object by what it *is* (:meth:`Normaliser.kind`);
* what an object is: the reference implementation's public classes it is an
  instance of, each looked up in the implementation under test by the same
  public path (``accelerate.data_loader.DataLoaderShard`` ->
  ``accelerate_ref.data_loader.DataLoaderShard``), and the classes of torch,
  torchdata, numpy and the standard library in its MRO;
* texts (messages, warnings, logs, printed output) read with the
  implementation's package name as the reference's, temporary folders as
  ``<tmp>`` and object addresses as ``0x?``;
* :func:`observe` runs one call and keeps its value or exception, the
  warnings it raised, the log records of the implementation's loggers and
  what it printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import importlib
import io
import logging
import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

#: Tensors of up to this many elements are described by their values, larger ones by a digest of their bytes.
MAX_LISTED_ELEMENTS = 64
#: How deep containers and dataclasses are followed.
MAX_DEPTH = 6
#: Modules whose classes in an object's MRO are part of what the object is (besides the reference's public ones).
EXTERNAL_ROOTS = ("torch", "torchdata", "numpy", "builtins", "collections", "abc", "typing", "enum",
                  "argparse", "logging", "os", "pathlib", "io", "json", "dataclasses", "functools", "safetensors")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


class ProbeTimeout(BaseException):
    """A probe ran past its timeout: never kept as a call's observation, it ends the probe."""


class ClassIndex:
    """The reference's public classes, each with one public path relative to its package root.

    ``resolve(root)`` gives the same classes as found in another implementation under those paths (the
    ones it lacks are left out: a missing name is the parity check's finding, not this one's).
    """

    def __init__(self, paths: dict[str, str]) -> None:
        #: public path relative to the package (``"data_loader.DataLoaderShard"``) -> qualified name in the reference
        self.paths = paths
        self._resolved: dict[str, list[tuple[str, type]]] = {}

    @classmethod
    @functools.cache
    def of_public_api(cls) -> "ClassIndex":
        """Walk HF accelerate's documented modules (the parity check's list) for their public classes (once)."""
        from .. import parity

        seen: dict[int, str] = {}
        paths: dict[str, str] = {}
        for module_name in parity.reference_modules():
            module = importlib.import_module(module_name)
            for name, value in parity.public_names(module):
                if isinstance(value, type) and id(value) not in seen:
                    relative = module_name.partition(".")[2]
                    path = f"{relative}.{name}" if relative else name
                    seen[id(value)] = path
                    paths[path] = f"{value.__module__}.{value.__qualname__}"
        return cls(paths)

    def resolve(self, root: Callable[[str], Any], key: str) -> list[tuple[str, type]]:
        """``(public path, class)`` for every public path ``root(path)`` finds a class under; cached by ``key``."""
        if key not in self._resolved:
            found = []
            for path in self.paths:
                try:
                    value = root(path)
                except Exception:  # noqa: BLE001 - an implementation without that name or module
                    continue
                if isinstance(value, type):
                    found.append((path, value))
            self._resolved[key] = found
        return self._resolved[key]


class Normaliser:
    """Turns values, exceptions and texts of one implementation into comparable plain data."""

    def __init__(self, names: dict[str, str], classes: list[tuple[str, type]], temporary: Iterable[str] = ()) -> None:
        """``names``: package names to read as another (``{"accelerate_ref": "accelerate"}``);
        ``classes``: this implementation's :class:`ClassIndex` entries; ``temporary``: folders read as ``<tmp>``."""
        self._names = [(re.compile(rf"(?<![\w.]){re.escape(old)}(?=\b)"), new) for old, new in names.items() if old != new]
        self._classes = classes
        self._by_identity = {id(cls): path for path, cls in classes}
        self.temporary = [str(path) for path in temporary]

    def text(self, value: str) -> str:
        for folder in self.temporary:
            value = value.replace(folder, "<tmp>")
        for pattern, new in self._names:
            value = pattern.sub(new, value)
        return _ADDRESS.sub("0x?", value)

    def kind(self, obj: Any) -> dict[str, Any]:
        """What ``obj`` is: its class name, the reference's public classes it is an instance of, external bases."""
        cls = type(obj)
        public = sorted(path for path, ref_cls in self._classes if _isinstance(obj, ref_cls))
        external = [f"{base.__module__}.{base.__qualname__}" for base in cls.__mro__
                    if base.__module__.split(".")[0] in EXTERNAL_ROOTS and base is not object]
        return {"type": cls.__name__, "is": public, "bases": external}

    def exception(self, error: BaseException) -> dict[str, Any]:
        described = self.kind(error)
        described["message"] = self.text(str(error))
        if isinstance(error, SystemExit):
            described["code"] = error.code
        return described

    def value(self, value: Any, depth: int = 0) -> Any:  # noqa: PLR0911 - one return per kind of value
        if isinstance(value, enum.Enum):  # before str and int: DistributedType is a str enum
            return {"enum": type(value).__name__, "value": self.value(value.value, depth + 1)}
        if value is None or isinstance(value, (bool, int)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else repr(value)
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bytes):
            return {"bytes": hashlib.sha1(value).hexdigest()}
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, np.ndarray):
            return {"ndarray": str(value.dtype), "shape": list(value.shape), **_digest(value.tobytes(), value.tolist()
                                                                                     if value.size <= MAX_LISTED_ELEMENTS else None)}
        if isinstance(value, (torch.dtype, torch.device, Path)):
            return {type(value).__name__: self.text(str(value))}
        if isinstance(value, type):
            return {"class": self._by_identity.get(id(value), f"{_root_free(value.__module__)}.{value.__qualname__}")}
        if isinstance(value, BaseException):
            return {"exception": self.exception(value)}
        if depth >= MAX_DEPTH:
            return {"object": type(value).__name__}
        if isinstance(value, (list, tuple, set, frozenset)):
            items = [self.value(item, depth + 1) for item in value]
            if isinstance(value, (set, frozenset)):
                items = sorted(items, key=repr)
            return items if type(value) is list else {type(value).__name__: items}
        if isinstance(value, dict):
            described = {self.text(str(key)): self.value(item, depth + 1) for key, item in value.items()}
            return described if type(value) is dict else {type(value).__name__: described}
        if dataclasses.is_dataclass(value):
            fields = {f.name: self.value(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value)}
            return {**self.kind(value), "fields": fields}
        if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, torch.nn.Module):
            return {"callable": self.text(value.__qualname__)}
        return self.kind(value)

    def tensor(self, tensor: torch.Tensor) -> dict[str, Any]:
        described: dict[str, Any] = {"tensor": str(tensor.dtype), "device": str(tensor.device), "shape": list(tensor.shape)}
        if tensor.requires_grad:
            described["requires_grad"] = True
        if tensor.is_meta:
            return described
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        listed = flat.tolist() if flat.numel() <= MAX_LISTED_ELEMENTS else None
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return {**described, **_digest(raw, listed)}


def _digest(raw: bytes, listed: list | None) -> dict[str, Any]:
    if listed is not None:
        return {"values": [repr(item) if isinstance(item, float) and not math.isfinite(item) else item for item in listed]}
    return {"sha1": hashlib.sha1(raw).hexdigest()}


def _root_free(module: str) -> str:
    """A module path without its package root: implementations place private classes differently."""
    head, _, rest = module.partition(".")
    return rest if head not in EXTERNAL_ROOTS else module


def _isinstance(obj: Any, cls: type) -> bool:
    try:
        return isinstance(obj, cls)
    except Exception:  # noqa: BLE001 - a class with a failing __instancecheck__ (typing generics) counts as no
        return False


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _captured_logs(loggers: Iterable[str]):
    handler = _Records()
    targets = [logging.getLogger(name) for name in loggers]
    for logger in targets:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in targets:
            logger.removeHandler(handler)


def observe(normaliser: Normaliser, loggers: Iterable[str], function: Callable[..., Any], *args: Any,
            **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """Call ``function(*args, **kwargs)``; return what it did (plain data) and its value (None if it raised).

    Every exception is kept, ``SystemExit`` included (argparse's refusals), except ``KeyboardInterrupt`` and
    :class:`ProbeTimeout`.
    """
    out, err = io.StringIO(), io.StringIO()
    value: Any = None
    observation: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught, _captured_logs(loggers) as records, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.simplefilter("always")
        try:
            value = function(*args, **kwargs)
            observation["value"] = normaliser.value(value)
        except (KeyboardInterrupt, ProbeTimeout):
            raise
        except BaseException as error:  # noqa: BLE001 - the exception is the observation
            observation["raises"] = normaliser.exception(error)
            value = None
    if caught:
        observation["warnings"] = [f"{w.category.__name__}: {normaliser.text(str(w.message))}" for w in caught]
    if records:
        observation["logs"] = [f"{normaliser.text(r.name)} {r.levelname}: {normaliser.text(r.getMessage())}"
                               for r in records]
    for stream, captured in (("stdout", out), ("stderr", err)):
        if captured.getvalue():
            observation[stream] = normaliser.text(captured.getvalue())
    return observation, value
