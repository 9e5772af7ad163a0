"""What a checkpoint of `Accelerator.save_state` holds, file by file, and how each is read back.

Files (names from `utils.constants`; the i-th object of a kind, i > 0,
gets ``_<i>`` before the extension):

=============================  ============================================  ===============
file                           content                                       written by
=============================  ============================================  ===============
``model.safetensors``          the unwrapped model's state dict              main process
(``pytorch_model.bin``)        (``safe_serialization=False``)
``optimizer.bin``              the optimizer's ``state_dict()``              main process
``scheduler.bin``              the scheduler's ``state_dict()``              main process
``sampler.bin``                the prepared data loader's position           main process
``dl_state_dict.bin``          a ``use_stateful_dataloader`` loader's        main process
                               ``state_dict()`` (instead of ``sampler.bin``)
``scaler.pt``                  the fp16 ``GradScaler``'s ``state_dict()``    main process
``custom_checkpoint_<i>.pkl``  a registered object's ``state_dict()``        main process
``random_states_<rank>.pkl``   that process's RNG states and ``step``        every process
=============================  ============================================  ===============

With ``save_on_each_node`` "main process" reads "local main process of
each machine". Everything is read back with safetensors or
``torch.load(weights_only=True)`` (unless ``load_kwargs`` say otherwise),
except the registered objects' ``custom_checkpoint_<i>.pkl``, which HF 1.15
reads with ``weights_only=False`` (their states may hold any object): load
only checkpoints you trust.

Checkpoints cross implementations: the names, keys and value types are HF
1.15's, so HF resumes from a folder written here and this module resumes
from one HF wrote. The random states are HF's layout exactly, numpy's key
array an ndarray (accelerate_ref stored it as an int64 tensor before; such
files still load): `utils._other.serialization.load`, as HF's ``load``, lets
weights_only loading rebuild numpy arrays, so the tensor bought no safety,
and a file in HF's layout reads the same to both libraries and their tools.
What HF does not write is optional on reading: HF writes ``sampler.bin``
only for an iterable dataset shard with a seedable sampler (in practice
never), so a loader without one is left where ``prepare`` put it, as HF
leaves it (`skip_first_batches` then skips into the epoch that begins).
The manifest (`_checkpointing.store`) is accelerate_ref's alone; HF ignores it
and a folder without one is not checked against it.

Catalog: save_state.roundtrip, save_state.file_names, save_state.resume_data_order,
register_for_checkpointing.
"""

from __future__ import annotations

import os
import random
import re
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import load_model

from ._checkpointing.store import CheckpointError
from .logging import get_logger
from .utils.constants import (
    MODEL_NAME,  # noqa: F401  (HF's checkpointing module exposes it)
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,  # noqa: F401  (HF's checkpointing module exposes it)
    SAFE_WEIGHTS_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_NAME,
)
from .utils._other.serialization import load, save, write_object

#: Accelerator device types whose RNG states are saved when present (as ``torch_<type>_manual_seed``).
_DEVICE_RNGS = ("cuda", "xpu", "npu", "mlu", "musa", "hpu")
_CUSTOM_FILE = re.compile(r"custom_checkpoint_(\d+)\.pkl")
#: HF 1.15's file for the state of a loader backed by torchdata's StatefulDataLoader (`_data_loader.adapter`).
STATEFUL_LOADER_NAME = "dl_state_dict.bin"
logger = get_logger(__name__)


def indexed_name(name: str, index: int) -> str:
    """``name`` for the ``index``-th object of its kind: ``optimizer.bin``, ``optimizer_1.bin``, ...

    Catalog: save_state.file_names.
    """
    if index == 0:
        return name
    stem, extension = os.path.splitext(name)
    return f"{stem}_{index}{extension}"


def rng_file_name(process_index: int) -> str:
    """``random_states_<process_index>.pkl``. Catalog: save_state.file_names."""
    return f"{RNG_STATE_NAME}_{process_index}.pkl"


def custom_file_name(index: int) -> str:
    """``custom_checkpoint_<index>.pkl``. Catalog: register_for_checkpointing."""
    return f"custom_checkpoint_{index}.pkl"


def _model_file_names(index: int) -> tuple[str, str]:
    """(safetensors name, pickle name) of the ``index``-th model's weights."""
    return indexed_name(SAFE_WEIGHTS_NAME, index), indexed_name(WEIGHTS_NAME, index)


def rng_states(step: int) -> dict[str, Any]:
    """This process's random states (Python, numpy, torch, accelerators, XLA) and ``step``, in HF 1.15's layout.

    Rule: the keys and values are HF's (``numpy_random_seed`` is
    ``np.random.get_state()`` itself, its key array a uint32 ndarray), so
    that either library resumes from the other's file. It still loads
    without running code: `utils._other.serialization.load` (as HF's ``load``)
    lets ``torch.load(weights_only=True)`` rebuild numpy arrays and nothing
    else beyond tensors. Catalog: save_state.roundtrip.
    """
    states: dict[str, Any] = {
        "step": step,
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    for device_type in _DEVICE_RNGS:
        module = getattr(torch, device_type, None)
        if module is not None and hasattr(module, "get_rng_state_all") and module.is_available():
            states[f"torch_{device_type}_manual_seed"] = module.get_rng_state_all()
    xla = sys.modules.get("torch_xla.core.xla_model")  # an XLA world imported it; nothing else does
    if xla is not None:
        states["xm_seed"] = xla.get_rng_state()
    return states


def _numpy_state(saved: tuple[Any, ...]) -> tuple[Any, ...]:
    """numpy's state tuple from a saved one, whose key array is an ndarray (HF, and accelerate_ref now) or an
    int64 tensor (checkpoints accelerate_ref wrote before it wrote HF's layout)."""
    kind, keys, *rest = saved
    if isinstance(keys, torch.Tensor):
        keys = keys.numpy()
    return (kind, np.asarray(keys, dtype=np.uint32), *rest)


def restore_rng_states(states: dict[str, Any]) -> None:
    """Put back the random states `rng_states` saved (or HF 1.15 did). Catalog: save_state.roundtrip."""
    random.setstate(states["random_state"])
    np.random.set_state(_numpy_state(states["numpy_random_seed"]))
    torch.set_rng_state(states["torch_manual_seed"])
    for device_type in _DEVICE_RNGS:
        key = f"torch_{device_type}_manual_seed"
        if key in states:
            getattr(torch, device_type).set_rng_state_all(states[key])
    if "xm_seed" in states:
        sys.modules["torch_xla.core.xla_model"].set_rng_state(states["xm_seed"])


def save_accelerator_state(
    output_dir: str | os.PathLike,
    model_states: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    step: int,
    scaler: Optional[torch.amp.GradScaler] = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> Path:
    """Write the files of a checkpoint (see the module's table) into ``output_dir``; return it.

    Rules: shared state (models, optimizers, schedulers, data loader
    positions, scaler) is written once (per machine with
    ``save_on_each_node``); every process writes its own
    ``random_states_<process_index>.pkl``. Model states are written with
    safetensors unless ``safe_serialization=False``. Every file is written
    atomically. A loader without ``state_dict`` (one that was not prepared)
    has no position to save and is skipped; one with ``use_stateful_dataloader``
    saves its StatefulDataLoader state to ``dl_state_dict.bin`` (HF's file).
    Loading reads either file back only where it is there.
    Catalog: save_state.roundtrip, save_state.file_names, save_state.resume_data_order.
    """
    directory = Path(output_dir)

    def shared(obj: Any, name: str, safe: bool = False) -> None:
        save(obj, directory / name, save_on_each_node=save_on_each_node, safe_serialization=safe)

    for i, state in enumerate(model_states):
        safe_name, pickle_name = _model_file_names(i)
        shared(state, safe_name if safe_serialization else pickle_name, safe=safe_serialization)
    for i, optimizer in enumerate(optimizers):
        shared(optimizer.state_dict(), indexed_name(f"{OPTIMIZER_NAME}.bin", i))
    for i, scheduler in enumerate(schedulers):
        shared(scheduler.state_dict(), indexed_name(f"{SCHEDULER_NAME}.bin", i))
    for i, dataloader in enumerate(dataloaders):
        if getattr(dataloader, "use_stateful_dataloader", False):
            shared(dataloader.state_dict(), indexed_name(STATEFUL_LOADER_NAME, i))
        elif hasattr(dataloader, "state_dict"):
            shared(dataloader.state_dict(), indexed_name(f"{SAMPLER_NAME}.bin", i))
    if scaler is not None:
        shared(scaler.state_dict(), SCALER_NAME)
    write_object(rng_states(step), directory / rng_file_name(process_index))
    return directory


def load_accelerator_state(
    input_dir: str | os.PathLike,
    models: list[torch.nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    scaler: Optional[torch.amp.GradScaler] = None,
    map_location: Optional[str] = None,
    load_kwargs: Optional[dict[str, Any]] = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Read back what `save_accelerator_state` wrote; return the Accelerator attributes to restore (``step``).

    Rules (HF 1.15's): ``models`` are the unwrapped models (their state
    dicts carry no wrapper prefixes), loaded from ``model.safetensors``
    with safetensors' ``load_model`` or else from ``pytorch_model.bin``
    with ``load_state_dict`` (``load_model_func_kwargs``, e.g. ``strict``,
    go to either); optimizer states go to the CPU (``map_location=None`` or
    ``"cpu"``) or this process's device (``"on_device"``), anything else
    is HF's TypeError; ``load_kwargs`` go to ``torch.load`` for the
    optimizer, scheduler and data loader states (``weights_only=True``
    unless they say otherwise). A missing model, optimizer, scheduler or
    scaler file is torch's FileNotFoundError naming it. A data loader's
    ``sampler.bin`` or ``dl_state_dict.bin`` is loaded where it is there
    (HF writes ``sampler.bin`` for no map-style loader); without it the
    loader stays unpositioned, as under HF. This process's random states
    (HF's or this module's, `restore_rng_states`) are restored when its
    ``random_states_<process_index>.pkl`` can be read, else that is logged
    at INFO and skipped (as is ``step`` then).
    Catalog: save_state.roundtrip, save_state.resume_data_order.
    """
    from .state import PartialState

    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, or `'on_device'`"
        )
    location: Any = PartialState().device if map_location == "on_device" else "cpu"
    directory = Path(input_dir)
    options = dict(load_kwargs or {})
    for i, model in enumerate(models):
        safe_name, pickle_name = _model_file_names(i)
        if (directory / safe_name).exists():
            load_model(model, directory / safe_name, device=str(location), **load_model_func_kwargs)
        else:
            model.load_state_dict(load(directory / pickle_name, map_location=location), **load_model_func_kwargs)
    for i, optimizer in enumerate(optimizers):
        optimizer.load_state_dict(load(directory / indexed_name(f"{OPTIMIZER_NAME}.bin", i), map_location=location,
                                       **options))
    for i, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(load(directory / indexed_name(f"{SCHEDULER_NAME}.bin", i), **options))
    for i, dataloader in enumerate(dataloaders):
        stateful = getattr(dataloader, "use_stateful_dataloader", False)
        position = directory / indexed_name(STATEFUL_LOADER_NAME if stateful else f"{SAMPLER_NAME}.bin", i)
        if hasattr(dataloader, "load_state_dict") and position.is_file():
            dataloader.load_state_dict(load(position, **options))
    if scaler is not None:
        scaler.load_state_dict(load(directory / SCALER_NAME))
    restored: dict[str, Any] = {}
    try:
        states = load(directory / rng_file_name(process_index))
        if "step" in states:
            restored["step"] = states["step"]
        restore_rng_states(states)
    except Exception:  # noqa: BLE001 - HF 1.15 resumes without the random states it cannot read
        logger.info("Could not load random states")
    return restored


def save_custom_state(obj: Any, path: str | os.PathLike, index: int = 0, save_on_each_node: bool = False) -> None:
    """Save ``obj.state_dict()`` to ``<path>/custom_checkpoint_<index>.pkl`` (main process). Catalog: register_for_checkpointing."""
    save(obj.state_dict(), Path(path) / custom_file_name(index), save_on_each_node=save_on_each_node)


def load_custom_state(obj: Any, path: str | os.PathLike, index: int = 0) -> None:
    """``obj.load_state_dict`` of ``<path>/custom_checkpoint_<index>.pkl`` (a missing file is torch's FileNotFoundError).

    Rule: read with ``weights_only=False``, as HF 1.15 reads it: the state
    of a registered object may hold any picklable object.
    Catalog: register_for_checkpointing.
    """
    obj.load_state_dict(load(f"{path}/{custom_file_name(index)}", map_location="cpu", weights_only=False))


def check_custom_files(input_dir: str | os.PathLike, registered: int) -> None:
    """The checkpoint must hold exactly one ``custom_checkpoint_<i>.pkl`` per registered object, i = 0, 1, ...

    A file of an object not registered now (or a missing one) is a
    CheckpointError naming the files, before anything is loaded.
    Catalog: register_for_checkpointing.
    """
    found = sorted(int(m.group(1)) for name in os.listdir(input_dir) if (m := _CUSTOM_FILE.fullmatch(name)))
    if found != list(range(registered)):
        names = [custom_file_name(i) for i in found]
        raise CheckpointError(
            f"{input_dir} holds the registered-object files {names} but {registered} object(s) are registered "
            f"(expected {[custom_file_name(i) for i in range(registered)]}); register the same objects, in the same "
            "order, as when the checkpoint was saved"
        )
