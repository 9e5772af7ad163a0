"""Sizes of a model's weights, memory budgets, tied parameters and moving one weight between devices.

Part of `accelerate_ref.utils.modeling` (re-exported there, where 🤗
Accelerate keeps these names). Everything works on a model whose weights
are on the ``meta`` device: only shapes and dtypes are read.

Catalog: modeling.sizes, modeling.max_memory_strings, modeling.tied_parameters,
modeling.tensor_to_device.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Iterator, Optional, Union

import torch
from torch import nn

from .units import convert_file_size_to_int, dtype_byte_size
from ..imports import (
    is_hpu_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_sdaa_available,
    is_xpu_available,
)

Device = Union[int, str, torch.device]
MaxMemory = dict[Union[int, str], Union[int, str]]

#: The non-accelerator keys of a ``max_memory`` budget, in placement order.
HOST_DEVICES = ("mps", "cpu", "disk")
#: Logged under HF's module name (``accelerate.utils.modeling``), where these functions live in HF.
logger = logging.getLogger("accelerate_ref.utils.modeling")
_INTEGER_DTYPES = ("torch.uint", "torch.int", "torch.bool")


def as_torch_device(device: Device) -> Union[str, torch.device]:
    """The torch device an entry of a device map names: an int is accelerator ``i`` (``npu:i`` on NPU, else ``cuda:i``)."""
    if isinstance(device, bool) or not isinstance(device, int):
        return device
    return f"npu:{device}" if is_npu_available() else f"cuda:{device}"


def accelerator_backend() -> tuple[str, object]:
    """The accelerator family HF asks for device counts and free memory, in HF's order of precedence
    (NPU, MLU, SDAA, MUSA, XPU, HPU, else CUDA): its name and its ``torch.<name>`` module."""
    for name, available in (("npu", is_npu_available), ("mlu", is_mlu_available), ("sdaa", is_sdaa_available),
                            ("musa", is_musa_available), ("xpu", is_xpu_available), ("hpu", is_hpu_available)):
        if available():
            return name, getattr(torch, name)
    return "cuda", torch.cuda


def _parse_dtype(dtype: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    """``"float16"`` or ``"torch.float16"`` as ``torch.float16`` (an unknown name is torch's AttributeError)."""
    if isinstance(dtype, str):
        return getattr(torch, dtype.replace("torch.", ""))
    return dtype


def _is_integer(dtype: torch.dtype) -> bool:
    """Integer and bool dtypes, which keep their own dtype when a model is cast or sized (HF's test by name)."""
    return str(dtype).startswith(_INTEGER_DTYPES)


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for the parameters of ``module`` and (``include_buffers``) its buffers.

    ``recurse`` walks submodules; ``remove_non_persistent`` leaves out the
    buffers named in `get_non_persistent_buffers` (attribute names, as in HF:
    with ``recurse`` a submodule's non-persistent buffer ``"sub.b"`` is kept,
    a buffer of the module itself named like one is dropped).
    Catalog: modeling.sizes.
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """The names of the buffers of ``module`` registered with ``persistent=False`` (not in its state dict).

    Rules (HF 1.15's): the module's own, by attribute name; with ``recurse``
    every module's of ``named_modules()`` too, by attribute name or, with
    ``fqns``, as ``"<module name>.<buffer>"``, so the module's own appear a
    second time as ``".b"`` (its name is ``""``). Catalog: modeling.sizes.
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, submodule in module.named_modules():
            names |= {f"{prefix}.{name}" if fqns else name for name in submodule._non_persistent_buffers_set}
    return names


#: Bytes per element for the storage-size fallbacks of `id_tensor_storage` (HF's table).
_ELEMENT_BYTES = {torch.int64: 8, torch.float32: 4, torch.int32: 4, torch.bfloat16: 2, torch.float16: 2,
                  torch.int16: 2, torch.uint8: 1, torch.int8: 1, torch.bool: 1, torch.float64: 8}


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, storage address, storage bytes)``: equal for tensors that share one storage (views, tied weights).

    Rule: the untyped storage's ``data_ptr()`` and ``nbytes()``; a tensor
    without one falls back to ``storage()`` and, where that is not
    implemented either, to address 0 and its element count's bytes. Two
    storages whose lifetimes do not overlap may get the same id.
    Catalog: modeling.tied_parameters.
    """
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except Exception:  # noqa: BLE001 - HF's fallbacks, for tensors without an untyped storage
        try:
            legacy = tensor.storage()
            return tensor.device, legacy.data_ptr(), legacy.size() * _ELEMENT_BYTES[tensor.dtype]
        except NotImplementedError:
            return tensor.device, 0, tensor.nelement() * _ELEMENT_BYTES[tensor.dtype]


def compute_module_sizes(
    model: nn.Module,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every tensor, every submodule and the whole model (key ``""``).

    Rules: a tensor's size is its element count times its dtype's bytes; a
    name in ``special_dtypes`` uses that dtype; otherwise with ``dtype``
    other tensors take the smaller of ``dtype`` and their own dtype
    (integer and bool tensors keep theirs; a complex one is sized as
    ``dtype`` if that is smaller, as HF does). Each tensor's size is added to
    every prefix of its dotted name. Catalog: modeling.sizes.
    """
    dtype = _parse_dtype(dtype)
    special = {name: dtype_byte_size(_parse_dtype(value)) for name, value in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        if name in special:
            size = tensor.numel() * special[name]
        elif dtype is None or _is_integer(tensor.dtype):
            size = tensor.numel() * dtype_byte_size(tensor.dtype)
        else:
            size = tensor.numel() * min(dtype_byte_size(dtype), dtype_byte_size(tensor.dtype))
        parts = name.split(".")
        for end in range(len(parts) + 1):
            sizes[".".join(parts[:end])] += size
    return sizes  # a defaultdict: a module whose weights are all tied to earlier ones has size 0


def compute_module_total_buffer_size(
    model: nn.Module, dtype: Union[str, torch.dtype, None] = None, special_dtypes: Optional[dict] = None
) -> int:
    """Bytes of all buffers of ``model`` (sizes as in `compute_module_sizes`). Catalog: modeling.sizes."""
    return compute_module_sizes(model, dtype, special_dtypes, buffers_only=True).get("", 0)


def get_max_layer_size(
    modules: list[tuple[str, Union[nn.Module, torch.Tensor]]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """The size of the biggest layer among ``modules`` and the names of the layers of that size.

    Rule: a layer is a module with no children, a module whose class name
    is in ``no_split_module_classes``, or a bare tensor; other modules are
    opened, depth first. Catalog: modeling.sizes.
    """
    largest, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or module.__class__.__name__ in no_split_module_classes:
            size = module_sizes[name]
            if size > largest:
                largest, names = size, [name]
            elif size == largest:
                names.append(name)
        else:
            pending = [(f"{name}.{child}", sub) for child, sub in children] + pending
    return largest, names


def top_level_entries(model: nn.Module) -> list[tuple[str, Union[nn.Module, torch.Tensor]]]:
    """The model's own parameters, then its children, then its own buffers: where placement starts."""
    return list(model.named_parameters(recurse=False)) + list(model.named_children()) + list(model.named_buffers(recurse=False))


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(total bytes, (largest layer bytes, its names))``, layers split by the model's ``_no_split_modules``.

    Catalog: modeling.sizes.
    """
    sizes = compute_module_sizes(model)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    return sizes[""], get_max_layer_size(top_level_entries(model), sizes, no_split)


def get_max_memory(max_memory: Optional[MaxMemory] = None) -> dict[Union[int, str], int]:
    """The memory budget per device, in bytes, ordered accelerators (by index), then mps, cpu, disk.

    Rules (HF 1.15's): without ``max_memory`` it is the free memory of every
    accelerator that answers (one that fails is logged at INFO and skipped)
    and the available RAM as ``"mps"`` on Apple silicon, else as ``"cpu"``
    (none on an integrated GPU, whose memory is the RAM). With one, its
    string values are converted in place (``"1GB"`` = 10**9, ``"500MiB"`` =
    500 * 2**20, see `convert_file_size_to_int`); an index past the
    accelerators present (or negative) is logged as a warning; a key that is
    no int, ``"mps"``, ``"cpu"`` or ``"disk"`` is a ValueError naming it.
    Catalog: modeling.max_memory_strings.
    """
    import psutil


    name, backend = accelerator_backend()
    if max_memory is None:
        budget: dict[Union[int, str], int] = {}
        integrated = False
        for index in range(backend.device_count()):
            try:
                # Initialises the device, and stays alive while its free memory is read (as HF's does).
                _ = torch.tensor([0], device=index if name == "cuda" else torch.device(name, index))
                budget[index] = backend.mem_get_info(index)[0]
                if name == "cuda":
                    integrated = integrated or getattr(torch.cuda.get_device_properties(index), "is_integrated", False)
            except Exception:  # noqa: BLE001 - HF skips a device that does not answer
                logger.info(f"Device {index} seems unavailable, Proceeding to check subsequent devices.")
        if is_mps_available():
            budget["mps"] = psutil.virtual_memory().available
        elif not integrated:
            budget["cpu"] = psutil.virtual_memory().available
        return budget
    for key in max_memory:
        if isinstance(max_memory[key], str):
            max_memory[key] = convert_file_size_to_int(max_memory[key])
    accelerators = sorted(key for key in max_memory if isinstance(key, int))
    count = backend.device_count()
    for index in accelerators:
        if index >= count or index < 0:
            logger.warning(f"Device {index} is not available, available devices are {list(range(count))}")
    ordered = accelerators + [key for key in HOST_DEVICES if key in max_memory]
    for key in max_memory:
        if key not in ordered:
            raise ValueError(
                f"Device {key} is not recognized, available devices are integers(for GPU/XPU), 'mps', 'cpu' and 'disk'"
            )
    return {key: max_memory[key] for key in ordered}


def find_tied_parameters(model: nn.Module, **kwargs) -> list[list[str]]:
    """Groups (sorted names) of parameters that are one and the same Parameter object.

    Rule (HF 1.15's): each group is keyed by the name ``named_parameters()``
    lists the Parameter under; the groups come in the order of the set of
    duplicate names. Catalog: modeling.tied_parameters.
    """
    every = dict(model.named_parameters(remove_duplicate=False))
    unique = dict(model.named_parameters(remove_duplicate=True))
    groups: dict[str, list[str]] = {}
    for duplicate in set(every) - set(unique):
        twin = every[duplicate]
        for name, parameter in unique.items():
            if parameter is twin:
                groups.setdefault(name, []).append(duplicate)
    return [sorted([name] + list(set(duplicates))) for name, duplicates in groups.items()]


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a 🤗 Transformers model's config asks for tied weights; False for any other module.

    Rule (the conditions of ``PreTrainedModel.tie_weights``): true when the
    decoder config has ``tie_word_embeddings`` and the model has output
    embeddings, when the config has both ``is_encoder_decoder`` and
    ``tie_encoder_decoder``, or when a submodule defines ``_tie_weights``.
    A model is a Transformers model when a class of its MRO is named
    ``PreTrainedModel``. Catalog: modeling.tied_parameters.
    """
    if "PreTrainedModel" not in [cls.__name__ for cls in type(model).__mro__]:
        return False
    config = getattr(model, "config", None)
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    word_embeddings = bool(getattr(text_config, "tie_word_embeddings", False) and model.get_output_embeddings())
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False) and getattr(config, "tie_encoder_decoder", False))
    return word_embeddings or encoder_decoder or any(hasattr(sub, "_tie_weights") for sub in model.modules())


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: list[tuple[str, nn.Module]],
) -> tuple[int, list[str], list[nn.Module]]:
    """The size of a module placed together with the modules holding the twins of its tied parameters.

    Rules: each name in ``tied_params`` (a twin outside the module) belongs
    to the first entry of ``modules_to_treat`` whose name is its prefix (none:
    an IndexError, as in HF); the result is ``module_size`` plus, per twin,
    that module's size minus the twin's own (counted once already), with the
    twins' module names and modules. No twins: ``(module_size, [], [])``.
    Catalog: modeling.tied_parameters.
    """
    if not tied_params:
        return module_size, [], []
    holders = [[entry for entry in modules_to_treat if twin.startswith(entry[0] + ".")][0] for twin in tied_params]
    total = module_size + sum(module_sizes[name] - module_sizes[twin] for twin, (name, _) in zip(tied_params, holders))
    return total, [name for name, _ in holders], [module for _, module in holders]


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """The names in ``module_sizes`` (as `compute_module_sizes` returns them) with no direct child in it.

    Rule: a name is a parent of ``"a.b"`` only as ``"a"`` (the part before
    the last dot); ``""`` (the whole model) is never a leaf; order is kept.
    Catalog: modeling.balanced_memory.
    """
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def _owner(model: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    """The module holding attribute ``dotted`` of ``model`` (walked with ``getattr``, as HF does) and its last name."""
    *path, attribute = dotted.split(".")
    for part in path:
        model = getattr(model, part)
    return model, attribute


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every group of ``tied_params`` one Parameter again: the first one of the group not on ``meta``.

    Rule (HF 1.15's): a group whose parameters are all on ``meta`` is left
    as it is; names are walked with ``getattr`` (an unknown one is the
    module's AttributeError). Catalog: modeling.tied_parameters.
    """
    for group in tied_params:
        shared = None
        for name in group:
            owner, attribute = _owner(model, name)
            candidate = getattr(owner, attribute)
            if candidate.device != torch.device("meta"):
                shared = candidate
                break
        if shared is None:
            continue
        for name in group:
            owner, attribute = _owner(model, name)
            setattr(owner, attribute, shared)


def _device_key(device: Device) -> Device:
    """The device ``set_module_tensor_to_device`` hands torch: an int index names its NPU/MLU/SDAA/MUSA device
    (``torch_npu`` refuses ``Tensor.to(<int>)``) or the HPU; otherwise it is passed on as given (an int is CUDA's)."""
    if not isinstance(device, int):
        return device
    for name, available in (("npu", is_npu_available), ("mlu", is_mlu_available), ("sdaa", is_sdaa_available),
                            ("musa", is_musa_available)):
        if available():
            return f"{name}:{device}"
    return "hpu" if is_hpu_available() else device


def _tied_copy(tied_params_map: Optional[dict], tensor: Optional[torch.Tensor], device: Device) -> Optional[torch.Tensor]:
    """The copy of ``tensor`` already placed on ``device`` for its tied group, if ``tied_params_map`` has one."""
    if tied_params_map is None or tensor is None:
        return None
    copies = tied_params_map.get(tensor.data_ptr())
    return copies[device] if copies is not None and device in copies else None


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: Device,
    value: Optional[torch.Tensor] = None,
    dtype: Union[str, torch.dtype, None] = None,
    fp16_statistics: Optional[torch.Tensor] = None,
    tied_params_map: Optional[dict[int, dict[Device, torch.Tensor]]] = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put parameter or buffer ``tensor_name`` (dotted) of ``module`` on ``device``, optionally with new data.

    Rules (HF 1.15's, with its messages): the dotted path is walked with
    ``getattr`` (a ``None`` on the way is a ValueError); a name that is no
    parameter or buffer is a ValueError quoting the module; ``value``
    replaces the data (another shape is a ValueError quoting both) and
    takes the old dtype, or ``dtype`` (a torch dtype) unless it is an
    integer or bool value; a tensor on ``meta`` needs a ``value``; moving to
    ``meta`` with a ``dtype`` casts a floating tensor; ``xpu`` without an
    XPU is a ValueError. A parameter stays a Parameter of its class with the
    same ``requires_grad``; one already on the device with no new value is
    left as it is. ``tied_params_map`` (``{data_ptr: {device: tensor}}``)
    reuses the copy already made on ``device`` for a tied weight and
    records new ones. The device cache is emptied after a move to an
    accelerator (``clear_cache``). Catalog: modeling.tensor_to_device.
    """
    from ..memory import clear_device_cache

    if "." in tensor_name:
        *path, tensor_name = tensor_name.split(".")
        for part in path:
            child = getattr(module, part)
            if child is None:
                raise ValueError(f"{module} has no attribute {part}.")
            module = child
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"{module} does not have a parameter or a buffer named {tensor_name}.")
    is_buffer = tensor_name in module._buffers
    old_value = getattr(module, tensor_name)
    for source in (value, old_value):
        reused = _tied_copy(tied_params_map, source, device)
        if reused is not None:
            module._parameters[tensor_name] = reused
            return
    if old_value.device == torch.device("meta") and device not in ("meta", torch.device("meta")) and value is None:
        raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")
    param = module._parameters[tensor_name] if tensor_name in module._parameters else None
    param_cls = type(param)
    if value is not None:
        if old_value.shape != value.shape and param_cls.__name__ != "Params4bit":
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{tensor_name}" (which has shape {old_value.shape}), '
                "this looks incorrect."
            )
        if dtype is None:
            value = value.to(old_value.dtype, non_blocking=non_blocking)
        elif not _is_integer(value.dtype):
            value = value.to(dtype, non_blocking=non_blocking)
    quantize_on = None
    with torch.no_grad():
        if (param is not None and param.device.type not in ("cuda", "xpu") and torch.device(device).type in ("cuda", "xpu")
                and param_cls.__name__ in ("Int8Params", "FP4Params", "Params4bit")):
            quantize_on, device = device, "cpu"  # bitsandbytes quantizes on its way to the GPU: stage on the CPU
        device = _device_key(device)
        if "xpu" in str(device) and not is_xpu_available():
            raise ValueError(f'{device} is not available, you should use device="cpu" instead')
        if value is None:
            new_value = old_value.to(device, non_blocking=non_blocking)
            if dtype is not None and device in ("meta", torch.device("meta")):
                if not _is_integer(old_value.dtype):
                    new_value = new_value.to(dtype, non_blocking=non_blocking)
                if not is_buffer:
                    module._parameters[tensor_name] = param_cls(new_value, requires_grad=old_value.requires_grad)
        elif isinstance(value, torch.Tensor):
            new_value = value.to(device, non_blocking=non_blocking)
        else:
            new_value = torch.tensor(value, device=device)
        if quantize_on is not None:
            device = quantize_on
        if is_buffer:
            module._buffers[tensor_name] = new_value
        elif value is not None or not check_device_same(torch.device(device), module._parameters[tensor_name].device):
            new_value = _as_parameter(module._parameters[tensor_name], new_value, old_value, device, non_blocking,
                                      fp16_statistics)
            module._parameters[tensor_name] = new_value
    if clear_cache and device not in ("cpu", "meta"):
        clear_device_cache()
    for source in (old_value, value):  # record the new copy under the first of the two its group is keyed by
        if (tied_params_map is not None and source is not None and source.data_ptr() in tied_params_map
                and device not in tied_params_map[source.data_ptr()]):
            tied_params_map[source.data_ptr()][device] = new_value
            break


def _as_parameter(current: nn.Parameter, new_value: torch.Tensor, old_value: torch.Tensor, device: Device,
                  non_blocking: bool, fp16_statistics: Optional[torch.Tensor]) -> nn.Parameter:
    """``new_value`` as the parameter replacing ``current``: of its class (a bitsandbytes one quantizes it; an
    optimum-quanto or torchao tensor is moved as it is), with ``old_value``'s ``requires_grad`` and any
    ``_is_hf_initialized`` mark of ``current``; ``fp16_statistics`` become its ``SCB`` (8-bit serialization)."""
    from ..bnb import quantized_parameter_like

    param_cls = type(current)
    is_hf_initialized = current.__dict__.pop("_is_hf_initialized", None)
    if param_cls.__name__ in ("Int8Params", "FP4Params", "Params4bit"):
        parameter = quantized_parameter_like(current, new_value.to(device, non_blocking=non_blocking))
    elif param_cls.__name__ in ("QTensor", "QBitsTensor"):
        parameter = nn.Parameter(new_value, requires_grad=old_value.requires_grad).to(device, non_blocking=non_blocking)
    elif param_cls.__name__ == "AffineQuantizedTensor" or "torchao" in getattr(param_cls, "__module__", ""):
        parameter = new_value.to(device, non_blocking=non_blocking)
    else:
        parameter = param_cls(new_value, requires_grad=old_value.requires_grad)
        # ``new_value`` is on ``device`` already; HF moves the Parameter there again, which for an indexed CPU
        # device (``cpu:0``, a CPU world's accelerator.device) copies it into a plain Tensor (catalog
        # save_model.reload): the CPU is left out of that second move.
        if torch.device(device).type != "cpu":
            parameter = parameter.to(device, non_blocking=non_blocking)
    if is_hf_initialized is not None:
        parameter._is_hf_initialized = is_hf_initialized
    if fp16_statistics is not None:
        parameter.SCB = fp16_statistics.to(device, non_blocking=non_blocking)
    return parameter


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
