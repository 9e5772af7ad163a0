"""Writing files that a crash never leaves half-written, and reading them without running code.

A file is written under a temporary name in its own directory, flushed and
fsynced, then renamed over its final name (a rename within a directory is
atomic), and the directory is fsynced so that the rename itself survives a
power cut. Readers therefore see the old file or the new one, never a part.

Loading uses safetensors for tensors and ``torch.load(weights_only=True)``
for everything else, which rebuilds tensors, numbers, strings and
containers but never imports or calls arbitrary code from the file.

`PartialState` is imported inside `save` (see `accelerate_ref.utils`: no
module here imports the state at import time).

Catalog: save.once_per_machine, save.array_example, save_model.default,
save_state.roundtrip.
"""

from __future__ import annotations

import collections
import os
import tempfile
from collections import OrderedDict
from typing import IO, Any, Callable, Union

import torch

PathOrFile = Union[str, os.PathLike, IO[bytes]]
#: HF 1.15 logs the removal of aliased tensors under its module accelerate.utils.other.
_LOGGER_NAME = "accelerate_ref.utils.other"


def fsync_directory(path: Union[str, os.PathLike]) -> None:
    """Make the entries of directory ``path`` (files created or renamed in it) durable. Catalog: save_state.roundtrip."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Union[str, os.PathLike], write: Callable[[IO[bytes]], None]) -> None:
    """Write a file with ``write(stream)`` so that ``path`` holds either its old content or the whole new one.

    Rule: the bytes go to a temporary file next to ``path``, which is
    flushed, fsynced and renamed over ``path``; the directory is fsynced
    after. If ``write`` fails the temporary file is removed and ``path`` is
    untouched. Catalog: save.array_example, save_state.roundtrip.
    """
    directory = os.path.dirname(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    fsync_directory(directory)


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` as safetensors can store it: tensors sharing storage kept once (the first key), all contiguous.

    Rules (HF 1.15's): tied weights (an embedding shared with the output
    layer) share one storage, which safetensors refuses; every later name
    of a shared storage is deleted from ``state_dict`` itself, and the
    main process logs ``Removed shared tensor {names} while saving. ...``
    (a set of the names) at WARNING on ``accelerate.utils.other``. String
    values (bitsandbytes' quantisation state) are kept as they are. The
    result is a new dict whose tensors are contiguous. Catalog:
    save_model.default.
    """
    from ...logging import get_logger
    from .._modeling.sizes import id_tensor_storage

    names_by_storage: dict[tuple[torch.device, int, int], list[str]] = collections.defaultdict(list)
    for name, tensor in state_dict.items():
        if not isinstance(tensor, str):
            names_by_storage[id_tensor_storage(tensor)].append(name)
    removed = {name for names in names_by_storage.values() for name in names[1:]}
    for name in removed:
        del state_dict[name]
    if removed:
        get_logger(_LOGGER_NAME).warning(
            f"Removed shared tensor {removed} while saving. This should be OK, but check by verifying that you "
            "don't receive any warning while reloading"
        )
    return {name: value.contiguous() if isinstance(value, torch.Tensor) else value
            for name, value in state_dict.items()}


def _safetensors_bytes(obj: Any) -> bytes:
    """``obj`` in safetensors' format; safetensors' own errors (a non-dict, a non-tensor value, shared memory) escape."""
    from safetensors.torch import save as safetensors_save

    return safetensors_save(obj, metadata={"format": "pt"})


def _check_parent_directory(f: Union[str, os.PathLike]) -> None:
    """torch.save's refusal of a path whose folder is missing, raised before any temporary file is made."""
    directory = os.path.dirname(os.fspath(f))
    if directory and not os.path.isdir(directory):
        raise RuntimeError(f"Parent directory {directory} does not exist.")


def write_object(obj: Any, f: PathOrFile, safe_serialization: bool = False) -> None:
    """Write ``obj`` to ``f`` on this process: safetensors, or ``torch.save`` (pickle); a path is written atomically.

    Catalog: save.array_example, save_state.file_names.
    """
    if safe_serialization:
        payload = _safetensors_bytes(obj)
        write: Callable[[IO[bytes]], Any] = lambda stream: stream.write(payload)  # noqa: E731
    else:
        write = lambda stream: torch.save(obj, stream)  # noqa: E731
    if isinstance(f, (str, os.PathLike)):
        if not safe_serialization:
            _check_parent_directory(f)
        write_atomically(f, write)
    else:
        write(f)


def save(obj: Any, f: PathOrFile, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Save ``obj`` to ``f`` once: on the main process, or once per machine with ``save_on_each_node``.

    Rules: in place of ``torch.save``; only the main process writes (with
    ``save_on_each_node``, the local main process of every machine, for
    machines that do not share a file system); ``safe_serialization``
    writes with safetensors instead of pickle, and an ``OrderedDict`` (a
    state dict) is first cleaned of aliases on every process
    (`clean_state_dict_for_safetensors`, which edits it); anything else
    goes to safetensors as it is, whose errors (a non-dict, a non-tensor
    value, tensors sharing memory) the writing process raises, as in HF
    1.15. A path is replaced atomically, so a failed or interrupted save
    leaves the previous file whole. Nothing is returned and no process
    waits for the others.
    Catalog: save.once_per_machine, save.array_example.
    """
    from ...state import PartialState

    if safe_serialization and isinstance(obj, OrderedDict):
        obj = clean_state_dict_for_safetensors(obj)
    state = PartialState()
    if state.is_local_main_process if save_on_each_node else state.is_main_process:
        write_object(obj, f, safe_serialization=safe_serialization)


def _torch_safe_globals() -> list[Any]:
    import codecs

    import numpy as np

    numpy_core = getattr(np, "_core", None) or np.core
    allowed: list[Any] = [numpy_core.multiarray._reconstruct, np.ndarray, codecs.encode, np.dtype]
    if hasattr(np, "dtypes"):  # numpy >= 1.25
        allowed.append(np.dtypes.UInt32DType)
    return allowed


#: What `load` lets `torch.load(weights_only=True)` rebuild beyond tensors: numpy arrays (RNG states among
#: them) and their dtypes, as HF 1.15's list.
TORCH_SAFE_GLOBALS = _torch_safe_globals()


def load(f: PathOrFile, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` that never runs code from the file: ``weights_only=True`` unless the caller says otherwise.

    Rule: tensors, numbers, strings, None, numpy arrays (TORCH_SAFE_GLOBALS,
    allowed for this call only) and containers of them load; a pickled object
    of any other class is refused by torch with an error naming it. Pass
    ``weights_only=False`` only for files you trust.
    Catalog: save.array_example, save_state.roundtrip.
    """
    kwargs.setdefault("weights_only", True)
    with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
        return torch.load(f, map_location=map_location, **kwargs)
