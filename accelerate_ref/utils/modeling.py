"""Model weights on disk: splitting a state dict into shards, and loading files, indexes and folders into a model.

The layouts are those `Accelerator.save_model` writes: one file
(``model.safetensors`` / ``pytorch_model.bin``), or shards
``model-00001-of-00003.safetensors`` ... with an index
``model.safetensors.index.json`` mapping each weight to its shard
(``{"metadata": {"total_size": bytes}, "weight_map": {name: file}}``).

Also here, where 🤗 Accelerate keeps them: reading the weights of
offloaded modules (`align_module_device`, `get_state_dict_offloaded_model`)
and the small device / precision helpers of its ``utils.modeling``
(`check_device_same`, `get_grad_scaler`, `get_mixed_precision_context_manager`,
`is_peft_model`). Sizes and device maps live in `module_sizes` and
`device_map`, re-exported here.

Catalog: shard_checkpoint.doc_example, save_model.sharded, save_model.reload.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional, Union

import torch
from safetensors import SafetensorError

from .constants import SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from .device_map import (
    check_device_map,
    check_tied_parameters_on_same_device,
    clean_device_map,
    device_of,
    fallback_allocate,
    get_balanced_memory,
    infer_auto_device_map,
)
from .module_sizes import (
    as_torch_device,
    calculate_maximum_sizes,
    check_tied_parameters_in_config,
    compute_module_sizes,
    compute_module_total_buffer_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from .low_precision import CustomDtype
from .offload import load_offloaded_weight, offload_weight, save_offload_index
from .serialization import load

if TYPE_CHECKING:
    from .dataclasses import AutocastKwargs, DistributedType

logger = logging.getLogger(__name__)

__all__ = [  # the names of 🤗 Accelerate's utils.modeling that live in the sibling modules
    "WEIGHTS_INDEX_NAME",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "fallback_allocate",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "id_tensor_storage",
    "infer_auto_device_map",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

DeviceMap = dict[str, Union[int, str, torch.device]]

_SIZE_UNITS = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def convert_file_size_to_int(size: Union[int, str]) -> int:
    """Bytes in ``size``: an int is returned as is; ``"5MB"`` is 5 * 10**6, ``"1GiB"`` 2**30.

    Rule: decimal units KB/MB/GB/TB, binary units KiB/MiB/GiB/TiB (any
    case); a lower-case ``b`` ending (``"5Mb"``) means bits, divided by 8.
    Anything else is a ValueError quoting it. Catalog: save_model.sharded.
    """
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise ValueError(f"a size in bytes cannot be negative, got {size}")
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)\s*", str(size), flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"size {size!r} is not an int of bytes or a number with a unit such as '5MB' or '1GiB'")
    number, unit = float(match.group(1)), match.group(2)
    value = int(number * _SIZE_UNITS[unit.upper()])
    return value // 8 if unit.endswith("b") and not unit.upper().endswith("IB") else value


#: Bytes per element of the element types torch lacks.
_CUSTOM_DTYPE_BYTES = {CustomDtype.INT2: 1 / 4, CustomDtype.INT4: 1 / 2, CustomDtype.FP8: 1}


def dtype_byte_size(dtype: Union[torch.dtype, CustomDtype]) -> float:
    """Bytes one element of ``dtype`` takes: 1/8 for ``torch.bool``; for a `CustomDtype`
    (how bitsandbytes sizes quantized weights) 1/4 for INT2, 1/2 for INT4, 1 for FP8.
    Catalog: shard_checkpoint.doc_example, quantization.load_and_quantize."""
    if isinstance(dtype, CustomDtype):
        return _CUSTOM_DTYPE_BYTES[dtype]
    if dtype == torch.bool:
        return 1 / 8
    return torch.empty((), dtype=dtype).element_size()


def _shard_name(weights_name: str, index: int, count: int) -> str:
    stem, extension = os.path.splitext(weights_name)
    return f"{stem}-{index:05d}-of-{count:05d}{extension}"


def shard_checkpoint(
    state_dict: dict[str, torch.Tensor], max_shard_size: Union[int, str] = "10GB", weights_name: str = WEIGHTS_NAME
) -> tuple[dict[str, dict[str, torch.Tensor]], Optional[dict[str, Any]]]:
    """Split ``state_dict`` into shards of at most ``max_shard_size`` bytes, in key order.

    Rules: weights are taken in the order of the keys and a new shard starts
    when the next weight would take the current one over the limit, so
    sizes [6, 6, 2, 6, 2, 2] with a limit of 10 give [6], [6+2], [6+2+2]
    (no reordering to fill shards better); a weight bigger than the limit
    gets a shard of its own; tensors sharing storage (tied weights) go to
    the same shard. Returns ``({file name: shard}, index)``: one shard is
    ``{weights_name: state_dict}`` with index None; several are named
    ``<stem>-00001-of-0000N<ext>`` and the index is ``{"metadata":
    {"total_size": bytes}, "weight_map": {weight: file name}}``.
    Catalog: shard_checkpoint.doc_example, save_model.sharded.
    """
    limit = convert_file_size_to_int(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_of_storage: dict[tuple[torch.device, int], int] = {}
    current_size = total_size = 0
    for name, weight in state_dict.items():
        storage = (weight.device, weight.untyped_storage().data_ptr())
        if storage in shard_of_storage and weight.device.type != "meta":
            shards[shard_of_storage[storage]][name] = weight
            continue
        size = int(weight.numel() * dtype_byte_size(weight.dtype))
        if current_size + size > limit and shards[-1]:
            shards.append({})
            current_size = 0
        shards[-1][name] = weight
        shard_of_storage[storage] = len(shards) - 1
        current_size += size
        total_size += size
    if len(shards) == 1:
        return {weights_name: shards[0]}, None
    named = {_shard_name(weights_name, i + 1, len(shards)): shard for i, shard in enumerate(shards)}
    weight_map = {name: file for file, shard in named.items() for name in shard}
    return named, {"metadata": {"total_size": total_size}, "weight_map": weight_map}


def _single_device(device_map: Optional[DeviceMap]) -> Optional[Union[int, str, torch.device]]:
    devices = set(device_map.values()) if device_map else set()
    return devices.pop() if len(devices) == 1 else None


def load_state_dict(checkpoint_file: Union[str, os.PathLike], device_map: Optional[DeviceMap] = None) -> dict[str, torch.Tensor]:
    """The state dict stored in one weights file, safetensors or ``torch.save``.

    Rules: a ``.safetensors`` file whose metadata names a format must say
    ``"pt"``; any other file is read with ``torch.load(weights_only=True)``
    (no code from the file runs). The tensors are returned on the device of
    a ``device_map`` that names one (``{"": device}``; ``cpu:0`` is the
    CPU), else on the CPU. A missing or damaged file is an error naming it.
    Catalog: save_model.reload.
    """
    path = os.fspath(checkpoint_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file at {path}")
    device = _single_device(device_map)
    device = "cpu" if device is None or device == "disk" else device
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open
            from safetensors.torch import load_file

            with safe_open(path, framework="pt") as handle:
                metadata = handle.metadata() or {}
            if metadata.get("format", "pt") != "pt":
                raise ValueError(f"{path} holds weights in the {metadata['format']!r} format; PyTorch weights ('pt') are needed")
            tensors = load_file(path)
        else:
            tensors = load(path, map_location="cpu")
    except (OSError, RuntimeError, EOFError, SafetensorError) as error:
        raise ValueError(f"cannot read the weights file {path} (missing, truncated or not a weights file): {error}") from error
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def checkpoint_files(checkpoint: Union[str, os.PathLike]) -> list[str]:
    """The weights files ``checkpoint`` names: a weights file, an ``.index.json``, or a folder with either.

    Rule: a folder is read through its one ``model.safetensors`` (else
    ``pytorch_model.bin``), else its one ``*.index.json``; no candidate, or
    several indexes, is a ValueError naming the folder. An index maps weight
    names to files under ``"weight_map"``, or is that mapping itself (as HF reads it).
    Catalog: save_model.reload, save_model.sharded.
    """
    path = os.fspath(checkpoint)
    if os.path.isdir(path):
        names = set(os.listdir(path))
        for single in (SAFE_WEIGHTS_NAME, WEIGHTS_NAME):
            if single in names:
                return [os.path.join(path, single)]
        indexes = sorted(name for name in names if name.endswith(".index.json"))
        if len(indexes) != 1:
            found = "several .index.json files " + ", ".join(indexes) if indexes else "no weights file"
            raise ValueError(
                f"{path} should hold {SAFE_WEIGHTS_NAME}, {WEIGHTS_NAME} or one .index.json of a sharded checkpoint; found {found}"
            )
        path = os.path.join(path, indexes[0])
    elif not os.path.isfile(path):
        raise ValueError(
            "`checkpoint` should be the path to a file containing a whole state dict, or the index of a sharded "
            f"checkpoint, or a folder containing a sharded checkpoint or the whole state dict, but got {path}."
        )
    if not path.endswith(".json"):
        return [path]
    with open(path, encoding="utf-8") as stream:
        index = json.load(stream)
    weight_map = index.get("weight_map", index)  # HF also takes an index that is the weight map itself
    return [os.path.join(os.path.dirname(path), name) for name in dict.fromkeys(weight_map.values())]


def _lazy_tensors(path: str) -> tuple[dict[str, tuple[int, ...]], Callable[[str], torch.Tensor]]:
    """The shapes of the weights in file ``path`` and a reader of one weight, never the whole file in RAM.

    A safetensors file is read one tensor at a time through ``safe_open``;
    a ``torch.save`` file is opened memory-mapped (``mmap=True``), so a
    tensor's bytes are read only when copied to its destination.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no weights file at {path}")
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            handle = safe_open(path, framework="pt")
            metadata = handle.metadata() or {}
            if metadata.get("format", "pt") != "pt":
                raise ValueError(f"{path} holds weights in the {metadata['format']!r} format; PyTorch weights ('pt') are needed")
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
            return shapes, handle.get_tensor
        tensors = load(path, map_location="cpu", mmap=True)
    except (OSError, RuntimeError, EOFError, SafetensorError) as error:
        raise ValueError(f"cannot read the weights file {path} (missing, truncated or not a weights file): {error}") from error
    return {name: tuple(tensor.shape) for name, tensor in tensors.items()}, tensors.__getitem__


def _target_dtype(name: str, current: torch.Tensor, loaded: torch.Tensor, dtype: Optional[torch.dtype], keep_in_fp32: list[str]) -> torch.dtype:
    """Floating weights take ``dtype`` (float32 inside ``keep_in_fp32_modules``), else the model's dtype."""
    if not loaded.is_floating_point():
        return loaded.dtype
    if any(name == module or name.startswith(module + ".") for module in keep_in_fp32):
        return torch.float32
    return dtype if dtype is not None else current.dtype


def _assign(model: torch.nn.Module, name: str, current: torch.Tensor, value: torch.Tensor, device: Any, dtype: torch.dtype) -> None:
    """Put ``value`` into the parameter or buffer ``name`` (now ``current``).

    In place, keeping the Parameter object (an optimizer holds it); a
    weight on the meta device has no data to keep and is replaced.
    """
    target = as_torch_device(device) if device is not None else ("cpu" if current.is_meta else current.device)
    with torch.no_grad():
        new = value.to(device=target, dtype=dtype)
        if current.is_meta:
            module_name, _, attribute = name.rpartition(".")
            module = model.get_submodule(module_name)
            if isinstance(current, torch.nn.Parameter):
                from .bnb import quantized_parameter_like  # an empty bitsandbytes layer quantizes what it is given

                parameter = quantized_parameter_like(current, new)
                if parameter is None:
                    parameter = torch.nn.Parameter(new, requires_grad=current.requires_grad)
                module.register_parameter(attribute, parameter)
            else:
                module.register_buffer(attribute, new, persistent=attribute not in module._non_persistent_buffers_set)
        elif new.device == current.device and new.dtype == current.dtype:
            current.copy_(new)
        elif new.device == current.device:
            current.data = new
        else:  # another device: a new tensor (a device's tensor type may not fit the old one's)
            set_module_tensor_to_device(model, name, target, value=new, dtype=dtype)


def _check_before_loading(
    model: torch.nn.Module, files: list[str], device_map: Optional[DeviceMap], offload_folder: Any, tensors: dict[str, torch.Tensor]
) -> None:
    """Refuse, before anything is loaded or written, a map naming unknown modules, "disk" without a folder, or wrong shapes."""
    if device_map is not None:
        known = set(dict(model.named_modules())) | set(tensors)
        unknown = [key for key in device_map if key != "" and key not in known]
        if unknown:
            raise ValueError(f"device_map names modules the model does not have: {unknown}")
        if "disk" in device_map.values() and offload_folder is None:
            disk = [key for key, device in device_map.items() if device == "disk"]
            raise ValueError(f"device_map offloads {disk} to 'disk': pass an offload_folder to write them to")
    for path in files:
        shapes, _ = _lazy_tensors(path)
        wrong = [
            f"{name}: the checkpoint holds shape {list(shape)}, the model {list(tensors[name].shape)}"
            for name, shape in shapes.items()
            if name in tensors and shape != tuple(tensors[name].shape)
        ]
        if wrong:
            raise ValueError(f"{path} does not fit the model (nothing was loaded): " + "; ".join(wrong))


def load_checkpoint_in_model(
    model: torch.nn.Module,
    checkpoint: Union[str, os.PathLike],
    device_map: Optional[DeviceMap] = None,
    offload_folder: Optional[Union[str, os.PathLike]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Optional[list[str]] = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Load a (possibly sharded) checkpoint into ``model``, placing weights where ``device_map`` says.

    Rules: ``checkpoint`` is a weights file, the ``.index.json`` of shards,
    or a folder holding one of them (`checkpoint_files`); files are read one
    tensor at a time (safetensors ``safe_open``, memory-mapped pickles), so
    the checkpoint is never held in RAM. Each weight goes into the model's
    parameter or buffer of the same name in place (the Parameter objects
    stay, so an optimizer built on them keeps working), on the device
    ``device_map`` gives its module (``{"": device}`` for the whole model;
    the longest matching module name wins), else where it already is. A
    ``"disk"`` entry writes the weight to ``offload_folder`` (a ``.dat``
    memmap per tensor plus ``index.json``, see `utils.offload`) and leaves it
    on ``meta`` in the model; buffers go to disk only with
    ``offload_buffers``, else to the CPU. ``offload_state_dict`` stages the
    CPU weights on disk while loading and reads them back at the end.
    Floating weights are cast to ``dtype`` if given (``keep_in_fp32_modules``
    stay float32), else to the model's dtype. Tied weights are tied again
    at the end. Refused before anything is loaded or written (ValueError
    naming the culprit): a map key that is no module of the model, a
    ``"disk"`` entry without ``offload_folder``, a weight whose shape differs.
    Keys the model lacks are logged in HF's words ("were not used when
    initializing"), weights the checkpoint lacks are warned about; either
    is a ValueError with ``strict=True``. Without a ``device_map``,
    ``broadcast_from_rank0`` has only rank 0 read the files and sends each
    tensor to the other ranks (torch's ``set_model_state_dict``; an
    initialised process group is needed, else a ValueError), with
    ``full_state_dict`` passed to it (whether the model's sharded DTensor
    weights are loaded from full tensors; for an unsharded model it changes
    nothing, as in HF); with a ``device_map`` every rank reads the files, as
    in HF. Catalog: save_model.reload, save_model.sharded, modeling.load_checkpoint_device_map.
    """
    if broadcast_from_rank0 and device_map is None:
        _load_broadcast_from_rank0(model, checkpoint, full_state_dict, strict)
        return
    if offload_8bit_bnb:
        raise NotImplementedError("accelerate_ref does not quantize weights while offloading them (offload_8bit_bnb)")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    tied = find_tied_parameters(model)
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    buffers = {name for name, _ in model.named_buffers(remove_duplicate=False)}
    files = checkpoint_files(checkpoint)
    _check_before_loading(model, files, device_map, offload_folder, tensors)
    if device_map is not None and "disk" in device_map.values():
        os.makedirs(offload_folder, exist_ok=True)
    expected = set(model.state_dict())
    disk_index: dict = {}
    staged_index: dict = {}
    staging = tempfile.mkdtemp(prefix="accelerate_ref_staged_") if offload_state_dict else None
    loaded_names: set[str] = set()
    unexpected: list[str] = []
    try:
        for path in files:
            shapes, read = _lazy_tensors(path)
            for name in shapes:
                if name not in expected:
                    unexpected.append(name)
                    continue
                value, current = read(name), tensors[name]
                device = device_of(name, device_map) if device_map is not None else None
                target_dtype = _target_dtype(name, current, value, dtype, keep_in_fp32_modules or [])
                if device == "disk" and (offload_buffers or name not in buffers):
                    offload_weight(value.to(target_dtype), name, offload_folder, index=disk_index)
                    set_module_tensor_to_device(model, name, "meta", dtype=target_dtype)
                elif staging is not None and device == "cpu":
                    offload_weight(value.to(target_dtype), name, staging, index=staged_index)
                    set_module_tensor_to_device(model, name, "meta", dtype=target_dtype)
                else:
                    _assign(model, name, current, value, "cpu" if device == "disk" else device, target_dtype)
                loaded_names.add(name)
        save_offload_index(disk_index, offload_folder or "")
        if staging is not None:
            load_offloaded_weights(model, staged_index, staging)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    retie_parameters(model, tied)
    loaded = {id(_tensor_of(model, name)) for name in loaded_names}  # a tied weight is loaded through its twin
    missing = sorted(name for name in expected if name not in loaded_names and id(_tensor_of(model, name)) not in loaded)
    _report_mismatched_keys(model, checkpoint, missing, unexpected, strict)


def _report_mismatched_keys(
    model: torch.nn.Module, checkpoint: Union[str, os.PathLike], missing: list[str], unexpected: list[str], strict: bool
) -> None:
    """A ValueError with ``strict``; else unused checkpoint keys logged in HF's words, missing weights warned about."""
    if strict and (missing or unexpected):
        raise ValueError(
            f"loading {os.fspath(checkpoint)}: weights missing from the checkpoint {missing}, keys the model lacks {unexpected}"
        )
    if unexpected:
        logger.warning(
            f"Some weights of the model checkpoint at {os.fspath(checkpoint)} were not used when initializing "
            f"{type(model).__name__}: {unexpected}. This may or may not be an issue - make sure that the checkpoint "
            "does not have unnecessary parameters, or that the model definition correctly corresponds to the checkpoint."
        )
    if missing:
        warnings.warn(f"loading {os.fspath(checkpoint)}: weights missing from the checkpoint {missing}")


def _load_broadcast_from_rank0(model: torch.nn.Module, checkpoint: Union[str, os.PathLike], full_state_dict: bool, strict: bool) -> None:
    """Rank 0 reads the checkpoint one file at a time; torch's ``set_model_state_dict`` sends each tensor to every rank.

    The other ranks need no copy of the files: rank 0 sends them the list
    of files and the names they hold first, so every rank makes the same
    calls and reaches the same verdict on missing and unexpected keys.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("broadcast_from_rank0=True needs an initialised torch.distributed process group (rank 0 reads, the others receive)")
    is_first = dist.get_rank() == 0
    files = checkpoint_files(checkpoint) if is_first else []
    listing = [[(path, list(_lazy_tensors(path)[0])) for path in files]]
    dist.broadcast_object_list(listing, src=0)
    options = StateDictOptions(full_state_dict=full_state_dict, strict=False, broadcast_from_rank0=True)
    expected = set(model.state_dict())
    for path, _ in listing[0]:
        set_model_state_dict(model, load_state_dict(path) if is_first else {}, options=options)
    names = {name for _, file_names in listing[0] for name in file_names}
    present = names | {twin for group in find_tied_parameters(model) if names & set(group) for twin in group}
    _report_mismatched_keys(model, checkpoint, sorted(expected - present), sorted(names - expected), strict)


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """Whether two torch devices are the same device, an accelerator without an index meaning index 0.

    Rule: different types differ; ``cuda`` equals ``cuda:0`` (any
    non-CPU type); ``cpu`` equals ``cpu``. Catalog: modeling.tensor_to_device.
    """
    if first_device.type != second_device.type:
        return False

    def indexed(device: torch.device) -> torch.device:
        return torch.device(device.type, 0) if device.type != "cpu" and device.index is None else device

    return indexed(first_device) == indexed(second_device)


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model``, unwrapped from DDP / compile wrappers, is a ``peft.PeftModel``; False without `peft`.

    No catalog ID: API parity with HF accelerate 1.15.
    """
    from .imports import is_peft_available
    from .other import extract_model_from_parallel

    if not is_peft_available():
        return False
    from peft import PeftModel

    return isinstance(extract_model_from_parallel(model), PeftModel)


def has_offloaded_params(module: torch.nn.Module) -> bool:
    """Whether ``module`` carries an `AlignDevicesHook` with ``offload=True`` (its weights live off the module).

    Catalog: bigmodel.cpu_offload.
    """
    from ..hooks import AlignDevicesHook

    hook = getattr(module, "_hf_hook", None)
    return isinstance(hook, AlignDevicesHook) and bool(hook.offload)


@contextlib.contextmanager
def align_module_device(module: torch.nn.Module, execution_device: Optional[torch.device] = None) -> Iterator[None]:
    """Inside the block, ``module``'s own parameters are materialised on a device; after it they are put back.

    Rules: an offloaded module (`has_offloaded_params`) runs its hook's
    ``pre_forward`` / ``post_forward`` around the block, on
    ``execution_device`` if given (the hook's own device is restored after),
    else on the hook's device. Any other module with ``execution_device``
    has its direct parameters moved there and back; without one nothing
    moves. Catalog: bigmodel.cpu_offload.
    """
    if has_offloaded_params(module):
        hook = module._hf_hook
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        devices = {name: parameter.device for name, parameter in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_offloaded_model(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of a model whose modules may be offloaded, every tensor on the CPU.

    Rules: each submodule is onloaded to the CPU in turn
    (`align_module_device`) and its state dict copied; a tensor still on
    ``meta`` afterwards (no weights anywhere) is left out with a warning
    naming it. The model's own direct weights (outside any submodule) are
    not included, as in HF. Catalog: bigmodel.cpu_offload, save_model.reload.
    """
    state_dict: dict[str, torch.Tensor] = {}
    on_meta: set[str] = set()
    for name, module in model.named_modules():
        if not name:
            continue
        with align_module_device(module, "cpu"):
            module_state = module.state_dict()
        for key, tensor in module_state.items():
            if tensor.device == torch.device("meta"):
                on_meta.add(f"{name}.{key}")
            else:
                state_dict[f"{name}.{key}"] = tensor.to("cpu")
    left_out = on_meta - set(state_dict)
    if left_out:
        warnings.warn(f"these tensors are still on the meta device and are not in the state dict: {sorted(left_out)}")
    return state_dict


def get_state_dict_from_offload(
    module: torch.nn.Module,
    module_name: str,
    state_dict: dict[str, Union[str, torch.Tensor]],
    device_to_put_offload: Union[int, str, torch.device] = "cpu",
) -> dict[str, Union[str, torch.Tensor]]:
    """Fill ``state_dict``'s entries for ``module`` with its tensors, onloaded to ``device_to_put_offload`` if offloaded.

    Rules: ``module_name`` is the dotted name of one of its tensors
    (``"layer.weight"``): its prefix up to the last dot names the module;
    only keys already in ``state_dict`` are replaced; a module that is not
    offloaded is read where it is. Returns ``state_dict``. Catalog: bigmodel.cpu_offload.
    """
    root = module_name[: module_name.rfind(".")]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = tensor
    return state_dict


def get_mixed_precision_context_manager(
    native_amp: bool = False, autocast_kwargs: Optional["AutocastKwargs"] = None
) -> ContextManager[Any]:
    """The autocast context of the current `AcceleratorState`'s precision, or a no-op one without ``native_amp``.

    Rules: ``torch.autocast`` on the state's device type, in float16 for
    ``"fp16"``, bfloat16 for ``"bf16"`` and ``"fp8"``, torch's default dtype
    for the device otherwise; ``autocast_kwargs`` (an `AutocastKwargs`) adds
    its arguments. Catalog: autocast.bf16.
    """
    from ..state import AcceleratorState

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    if not native_amp:
        return contextlib.nullcontext()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(state.mixed_precision)
    if dtype is not None:
        kwargs["dtype"] = dtype
    return torch.autocast(device_type=state.device.type, **kwargs)


def get_grad_scaler(distributed_type: Optional["DistributedType"] = None, **kwargs: Any) -> torch.amp.GradScaler:
    """The gradient scaler for fp16 training here, built with ``kwargs``.

    Rules: FSDP (``DistributedType.FSDP``) gets torch's
    ``ShardedGradScaler``; otherwise a ``torch.amp.GradScaler`` for the
    first accelerator type present (NPU, MLU, MUSA, SDAA, HPU, XPU, MPS),
    else for ``"cuda"`` (on a CPU-only host torch disables it with a
    warning, as HF's does). Catalog: autocast.fp16_scaler.
    """
    from . import imports
    from .dataclasses import DistributedType

    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**kwargs)
    checks = ("npu", "mlu", "musa", "sdaa", "hpu", "xpu", "mps")
    device = next((name for name in checks if getattr(imports, f"is_{name}_available")()), "cuda")
    return torch.amp.GradScaler(device, **kwargs)


def _tensor_of(model: torch.nn.Module, name: str) -> torch.Tensor:
    module_name, _, attribute = name.rpartition(".")
    module = model.get_submodule(module_name)
    return module._parameters[attribute] if attribute in module._parameters else module._buffers[attribute]


def load_offloaded_weights(model: torch.nn.Module, index: dict, offload_folder: Union[str, os.PathLike]) -> None:
    """Put every weight of ``index`` (read from ``offload_folder``) into ``model`` on the CPU, bit-exactly.

    Catalog: modeling.offload_roundtrip.
    """
    for name, info in (index or {}).items():
        weight = load_offloaded_weight(os.path.join(os.fspath(offload_folder), f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight, dtype=weight.dtype)
