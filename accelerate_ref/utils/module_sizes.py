"""Sizes of a model's weights, memory budgets, tied parameters and moving one weight between devices.

Part of `accelerate_ref.utils.modeling` (re-exported there, where 🤗
Accelerate keeps these names). Everything works on a model whose weights
are on the ``meta`` device: only shapes and dtypes are read.

Catalog: modeling.sizes, modeling.max_memory_strings, modeling.tied_parameters,
modeling.tensor_to_device.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator, Optional, Union

import torch
from torch import nn

from .imports import is_npu_available

Device = Union[int, str, torch.device]
MaxMemory = dict[Union[int, str], Union[int, str]]

#: The non-accelerator keys of a ``max_memory`` budget, in placement order.
HOST_DEVICES = ("mps", "cpu", "disk")


def _byte_size(dtype: torch.dtype) -> float:
    from .modeling import dtype_byte_size

    return dtype_byte_size(dtype)


def as_torch_device(device: Device) -> Union[str, torch.device]:
    """The torch device an entry of a device map names: an int is accelerator ``i`` (``npu:i`` on NPU, else ``cuda:i``)."""
    if isinstance(device, bool) or not isinstance(device, int):
        return device
    return f"npu:{device}" if is_npu_available() else f"cuda:{device}"


def _parse_dtype(dtype: Union[str, torch.dtype, None]) -> Optional[torch.dtype]:
    if isinstance(dtype, str):
        return getattr(torch, dtype.replace("torch.", ""))
    return dtype


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for the parameters of ``module`` and (``include_buffers``) its buffers.

    ``recurse`` walks submodules; ``remove_non_persistent`` leaves out
    buffers that are not part of the state dict. Catalog: modeling.sizes.
    """
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped = get_non_persistent_buffers(module, recurse, fqns=True) if remove_non_persistent else set()
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """The names of the buffers of ``module`` registered with ``persistent=False`` (not in its state dict).

    Rules: without ``recurse`` only the module's own buffers; with it the
    submodules' too, by attribute name (``"b"``) or, with ``fqns``, by
    dotted name from ``module`` (``"sub.b"``). HF accelerate 1.15 also
    lists the module's own buffers a second time as ``".b"`` when both flags
    are set; that artefact is not reproduced. Catalog: modeling.sizes.
    """
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, submodule in module.named_modules():
            qualify = fqns and prefix
            names |= {f"{prefix}.{name}" if qualify else name for name in submodule._non_persistent_buffers_set}
    return names


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, storage address, storage bytes)``: equal for tensors that share one storage (views, tied weights).

    Rule: the untyped storage's ``data_ptr()`` and ``nbytes()``; every
    ``meta`` tensor has address 0. Two storages whose lifetimes do not
    overlap may get the same id. Catalog: modeling.tied_parameters.
    """
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):  # a tensor subclass without a storage
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def compute_module_sizes(
    model: nn.Module,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every tensor, every submodule and the whole model (key ``""``).

    Rules: a tensor's size is its element count times its dtype's bytes; a
    name in ``special_dtypes`` uses that dtype; otherwise with ``dtype``
    floating tensors take the smaller of ``dtype`` and their own dtype
    (integer and bool tensors keep theirs). Each tensor's size is added to
    every prefix of its dotted name. Catalog: modeling.sizes.
    """
    dtype = _parse_dtype(dtype)
    special = {name: _byte_size(_parse_dtype(value)) for name, value in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        if name in special:
            size = tensor.numel() * special[name]
        elif dtype is None or not tensor.is_floating_point():
            size = tensor.numel() * _byte_size(tensor.dtype)
        else:
            size = tensor.numel() * min(_byte_size(dtype), _byte_size(tensor.dtype))
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

    Rules: without ``max_memory`` it is the free memory of every
    accelerator and the available RAM as ``"cpu"``; with one, string values
    are converted (``"1GB"`` = 10**9, ``"500MiB"`` = 500 * 2**20, see
    `convert_file_size_to_int`) and an unknown key is a ValueError naming it.
    Catalog: modeling.max_memory_strings.
    """
    import psutil

    from .modeling import convert_file_size_to_int

    if max_memory is None:
        budget: dict[Union[int, str], int] = {}
        if is_npu_available():
            for index in range(torch.npu.device_count()):
                budget[index] = torch.npu.mem_get_info(index)[0]
        elif torch.cuda.is_available():
            for index in range(torch.cuda.device_count()):
                budget[index] = torch.cuda.mem_get_info(index)[0]
        budget["cpu"] = psutil.virtual_memory().available
        return budget
    converted: dict[Union[int, str], int] = {}
    for key, value in max_memory.items():
        if not (isinstance(key, int) and not isinstance(key, bool)) and key not in HOST_DEVICES:
            raise ValueError(f"max_memory key {key!r} is not a device: use accelerator indices (ints), 'mps', 'cpu' or 'disk'")
        try:
            converted[key] = convert_file_size_to_int(value)
        except ValueError as error:
            raise ValueError(f"max_memory[{key!r}] = {value!r} is not a memory size: {error}") from error
    accelerators = sorted(key for key in converted if isinstance(key, int))
    return {key: converted[key] for key in accelerators + [k for k in HOST_DEVICES if k in converted]}


def find_tied_parameters(model: nn.Module, **kwargs) -> list[list[str]]:
    """Groups (sorted names) of parameters that are one and the same Parameter object. Catalog: modeling.tied_parameters."""
    groups: dict[int, list[str]] = defaultdict(list)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups[id(parameter)].append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


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
    to the first entry of ``modules_to_treat`` whose name is its prefix;
    the result is ``module_size`` plus, per twin, that module's size minus
    the twin's own (counted once already), with the twins' module names and
    modules. No twins: ``(module_size, [], [])``. Catalog: modeling.tied_parameters.
    """
    total, names, modules = module_size, [], []
    for twin in tied_params:
        holder = next(((n, m) for n, m in modules_to_treat if twin.startswith(n + ".")), None)
        if holder is None:
            raise ValueError(f"no module among modules_to_treat holds the tied parameter {twin}")
        name, module = holder
        names.append(name)
        modules.append(module)
        total += module_sizes[name] - module_sizes[twin]
    return total, names, modules


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """The names in ``module_sizes`` (as `compute_module_sizes` returns them) with no direct child in it.

    Rule: a name is a parent of ``"a.b"`` only as ``"a"`` (the part before
    the last dot); ``""`` (the whole model) is never a leaf; order is kept.
    Catalog: modeling.balanced_memory.
    """
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if "." in name}
    return [name for name in module_sizes if name and name not in parents]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every group of ``tied_params`` one Parameter again: the first one not on ``meta`` (else the first).

    Catalog: modeling.tied_parameters.
    """
    for group in tied_params:
        parameters = [model.get_parameter(name) for name in group]
        shared = next((p for p in parameters if not p.is_meta), parameters[0])
        for name in group:
            module_name, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(module_name), attribute, shared)


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

    Rules: ``value`` replaces the data (same shape, else a ValueError naming
    both shapes) and takes ``dtype`` if given, else the old dtype (integer
    and bool values keep theirs); a tensor on ``meta`` needs a ``value``; a
    parameter stays a Parameter with the same ``requires_grad``.
    ``tied_params_map`` (``{data_ptr: {device: tensor}}``) reuses a copy
    already made on ``device`` for a tied weight. Catalog: modeling.tensor_to_device.
    """
    owner_name, _, attribute = tensor_name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if attribute not in owner._parameters and attribute not in owner._buffers:
        raise ValueError(f"{owner.__class__.__name__} has no parameter or buffer named {attribute!r} ({tensor_name})")
    is_buffer = attribute in owner._buffers
    old = owner._buffers[attribute] if is_buffer else owner._parameters[attribute]
    target = as_torch_device(device)
    if value is None and old.is_meta and str(target) != "meta":
        raise ValueError(f"{tensor_name} is on the meta device: a value is needed to put it on {target}")
    if tied_params_map is not None and value is not None and not old.is_meta:
        reused = tied_params_map.get(old.data_ptr(), {}).get(device)
        if reused is not None:
            owner._parameters[attribute] = reused
            return
    dtype = _parse_dtype(dtype)
    with torch.no_grad():
        if value is not None:
            value = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            if tuple(value.shape) != tuple(old.shape):
                raise ValueError(f"cannot set {tensor_name} of shape {list(old.shape)} to a value of shape {list(value.shape)}")
            if dtype is None:
                value = value.to(old.dtype)
            elif value.is_floating_point():
                value = value.to(dtype)
        elif dtype is not None and old.is_floating_point():
            value = old.to(dtype)
        new = (old if value is None else value).to(target, non_blocking=non_blocking)
    if is_buffer:
        owner._buffers[attribute] = new
    elif isinstance(old, nn.Parameter) and new is old:
        return
    else:
        from .bnb import quantized_parameter_like  # a bitsandbytes weight given new data quantizes it

        parameter = quantized_parameter_like(old, new) if value is not None else None
        if parameter is None:
            parameter_class = type(old) if isinstance(old, nn.Parameter) else nn.Parameter
            parameter = parameter_class(new, requires_grad=old.requires_grad)
        owner._parameters[attribute] = parameter
