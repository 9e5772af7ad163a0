"""The files a probe wrote, as plain data: names, and the keys, dtypes and shapes of what checkpoints hold.

A user who switches implementations resumes from the other one's folder, so
what a file *holds* is compared, not its bytes (pickle framing and
safetensors' metadata order may differ without a reader noticing):

* ``.bin`` / ``.pt`` / ``.pth`` / ``.pkl``: loaded with ``torch.load`` and
  described by structure (mapping keys, tensor dtypes and shapes, the types
  of other leaves);
* ``.safetensors``: tensor names, dtypes and shapes, read with safetensors;
* ``.json`` / ``.yaml`` / ``.yml``: the parsed content;
* anything else: the name alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from .observe import Normaliser

_PICKLED = {".bin", ".pt", ".pth", ".pkl"}
_MAX_DEPTH = 6


def describe_files(folder: Path, normaliser: Normaliser) -> dict[str, Any]:
    """Every file under ``folder`` (relative path -> what it holds), in name order."""
    described: dict[str, Any] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        described[path.relative_to(folder).as_posix()] = _content(path, normaliser)
    return described


def _content(path: Path, normaliser: Normaliser) -> Any:
    suffix = path.suffix.lower()
    try:
        if suffix in _PICKLED:
            return structure(torch.load(path, map_location="cpu", weights_only=False))
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                return {key: _tensor(handle.get_tensor(key)) for key in sorted(handle.keys())}
        if suffix == ".json":
            return normaliser.value(json.loads(path.read_text(encoding="utf-8")))
        if suffix in {".yaml", ".yml"}:
            return normaliser.value(yaml.safe_load(path.read_text(encoding="utf-8")))
    except Exception as error:  # noqa: BLE001 - an unreadable file is itself what the probe wrote
        return {"unreadable": type(error).__name__}
    return "file"


def structure(value: Any, depth: int = 0) -> Any:
    """What a loaded checkpoint holds: mappings and sequences by keys, tensors by dtype and shape."""
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, np.ndarray):
        return {"ndarray": str(value.dtype), "shape": list(value.shape)}
    if depth >= _MAX_DEPTH:
        return type(value).__name__
    if isinstance(value, dict):
        return {str(key): structure(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [structure(item, depth + 1) for item in value]
    return type(value).__name__


def _tensor(tensor: torch.Tensor) -> dict[str, Any]:
    return {"tensor": str(tensor.dtype), "shape": list(tensor.shape)}
