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
import gc
import json
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, ContextManager, Iterator, Optional, Union

import torch

from .constants import SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from ._modeling.device_map import (
    check_device_map,
    check_tied_parameters_on_same_device,
    clean_device_map,
    device_of,
    fallback_allocate,
    get_balanced_memory,
    infer_auto_device_map,
    warn_if_untied,
)
from ._modeling.units import convert_file_size_to_int, dtype_byte_size
from ._modeling.sizes import (
    check_device_same,
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
    logger,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from ._dataclasses.low_precision import CustomDtype  # noqa: F401  (HF 1.15 names it in utils.modeling)
from .offload import load_offloaded_weight, offload_weight, save_offload_index

if TYPE_CHECKING:
    from .dataclasses import AutocastKwargs, DistributedType

__all__ = [  # the names of 🤗 Accelerate's utils.modeling that live in `_modeling`
    "WEIGHTS_INDEX_NAME",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
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


def _safetensors_device(device: Union[int, str, torch.device]) -> Union[int, str]:
    """Where safetensors puts a tensor for a device map entry: an int is ``npu:<i>`` on NPU, ``"hpu"`` on HPU; a
    ``torch.device`` is named by its string, the CPU as ``"cpu"`` (``accelerator.device`` of a CPU world is
    ``cpu:0``), which safetensors accepts where HF hands it the device as is (catalog save_model.reload)."""
    from .imports import is_hpu_available, is_npu_available

    if isinstance(device, int):
        if is_npu_available():
            return f"npu:{device}"
        if is_hpu_available():
            return "hpu"
        return device
    if isinstance(device, torch.device) or str(device).startswith("cpu:"):
        return "cpu" if torch.device(device).type == "cpu" else str(device)
    return device


def load_state_dict(checkpoint_file: str, device_map: Optional[DeviceMap] = None) -> dict[str, torch.Tensor]:
    """The state dict stored in one weights file, safetensors or ``torch.save``.

    Rules (HF 1.15's, with its messages): a ``.safetensors`` file without
    metadata is read as ``"pt"`` (logged as a warning); a format other than
    ``"pt"``, ``"tf"`` or ``"flax"`` is an OSError, ``"tf"``/``"flax"`` a
    ValueError. With a ``device_map`` naming one device the tensors are read
    there; naming several, each weight is read onto its module's device
    (``"disk"`` weights and those no key names onto the CPU), with a
    progress bar. A ``torch.device`` in the map (the quicktour's
    ``device_map={"": accelerator.device}``) is read there too, where HF
    hands it to safetensors, which refuses it. Any other file is read with
    ``torch.load(weights_only=True)`` on the CPU. ``checkpoint_file`` is a
    ``str`` (HF calls ``endswith`` on it). Catalog: save_model.reload.
    """
    if not checkpoint_file.endswith(".safetensors"):
        return torch.load(checkpoint_file, map_location=torch.device("cpu"), weights_only=True)
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(checkpoint_file, framework="pt") as handle:
        metadata = handle.metadata()
        weight_names = handle.keys()
    if metadata is None:
        logger.warning(
            f"The safetensors archive passed at {checkpoint_file} does not contain metadata. "
            "Make sure to save your model with the `save_pretrained` method. Defaulting to 'pt' metadata."
        )
        metadata = {"format": "pt"}
    if metadata.get("format") not in ("pt", "tf", "flax"):
        raise OSError(
            f"The safetensors archive passed at {checkpoint_file} does not contain the valid metadata. Make sure "
            "you save your model with the `save_pretrained` method."
        )
    if metadata["format"] != "pt":
        raise ValueError(f"The checkpoint passed was saved with {metadata['format']}, we need a the pt format.")
    if device_map is None:
        return load_file(checkpoint_file)
    if len(set(device_map.values())) == 1:
        return load_file(checkpoint_file, device=_safetensors_device(list(device_map.values())[0]))
    return _load_per_device(checkpoint_file, device_map, weight_names)


def _load_per_device(checkpoint_file: str, device_map: DeviceMap, weight_names: list[str]) -> dict[str, torch.Tensor]:
    """Each weight of a safetensors file read onto the device of its module (the CPU for disk and unnamed ones)."""
    from safetensors import safe_open

    from .imports import is_tqdm_available

    devices = list(set(device_map.values()) - {"disk"})
    if "cpu" not in devices:
        devices.append("cpu")
    names_on: dict = {device: [] for device in devices}
    for module_name, device in device_map.items():
        if device in devices:
            names_on[device].extend(k for k in weight_names if k == module_name or k.startswith(module_name + "."))
    placed = sum(names_on.values(), [])
    names_on["cpu"].extend(k for k in weight_names if k not in placed)
    bar = None
    if is_tqdm_available():
        from .tqdm import tqdm

        bar = tqdm(main_process_only=False, total=sum(len(names_on[d]) for d in devices), unit="w", smoothing=0, leave=False)
    tensors = {}
    for device in devices:
        with safe_open(checkpoint_file, framework="pt", device=_safetensors_device(device)) as handle:
            for key in names_on[device]:
                if bar is not None:
                    bar.set_postfix(dev=device, refresh=False)
                    bar.set_description(key)
                tensors[key] = handle.get_tensor(key)
                if bar is not None:
                    bar.update()
    if bar is not None:
        bar.close()
    return tensors


def checkpoint_files(checkpoint: Union[str, os.PathLike]) -> list[str]:
    """The weights files ``checkpoint`` names: a weights file, an ``.index.json``, or a folder with either.

    Rules (HF 1.15's, with its messages): a folder is read through its
    ``pytorch_model.bin``, else its ``model.safetensors``, else its one
    ``*.index.json`` (none, or several, is a ValueError naming the folder);
    an index maps weight names to files under ``"weight_map"`` (or is that
    mapping itself) and gives its files in name order; a path that is no file
    or folder is a ValueError. Catalog: save_model.reload, save_model.sharded.
    """
    index_file = None
    if os.path.isfile(checkpoint):
        if not str(checkpoint).endswith(".json"):
            return [checkpoint]
        index_file = checkpoint
    elif os.path.isdir(checkpoint):
        names = os.listdir(checkpoint)
        for single in (WEIGHTS_NAME, SAFE_WEIGHTS_NAME):
            if single in names:
                return [os.path.join(checkpoint, single)]
        indexes = [name for name in names if name.endswith(".index.json")]
        if not indexes:
            raise ValueError(
                f"{checkpoint} is not a folder containing a `.index.json` file or a {WEIGHTS_NAME} or a "
                f"{SAFE_WEIGHTS_NAME} file"
            )
        if len(indexes) > 1:
            raise ValueError(f"{checkpoint} containing more than one `.index.json` file, delete the irrelevant ones.")
        index_file = os.path.join(checkpoint, indexes[0])
    else:
        raise ValueError(
            "`checkpoint` should be the path to a file containing a whole state dict, or the index of a sharded "
            f"checkpoint, or a folder containing a sharded checkpoint or the whole state dict, but got {checkpoint}."
        )
    with open(index_file) as stream:
        index = json.loads(stream.read())
    index = index.get("weight_map", index)
    return [os.path.join(os.path.split(index_file)[0], name) for name in sorted(set(index.values()))]


def _keeps_fp32(param_name: str, keep_in_fp32_modules: list[str]) -> bool:
    """HF's test: a module name of the list appears in the weight's name followed by a dot, or is the name."""
    return any((key in param_name and key + "." in param_name) or key == param_name for key in keep_in_fp32_modules)


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

    Rules (HF 1.15's, with its messages): ``checkpoint`` (a ``str`` or an
    ``os.PathLike``, as HF's signature says, though HF fails on a PathLike
    naming a file) is a weights file, the ``.index.json`` of shards, or a
    folder holding one of them (`checkpoint_files`); each file is read whole
    (`load_state_dict`).
    Without a ``device_map`` the model takes each file through torch's
    ``set_model_state_dict`` (``strict``, ``full_state_dict`` and
    ``broadcast_from_rank0``: rank 0 reads, the others receive; ``dtype`` is
    not applied); a model spread over several devices through its own
    ``load_state_dict``. With a map each weight goes to the device of its
    longest module prefix (`set_module_tensor_to_device`: a new tensor, cast
    to ``dtype`` if given, float32 inside ``keep_in_fp32_modules`` when
    ``dtype`` is float16); a weight no key covers is a ValueError. A
    ``"disk"`` entry needs ``offload_folder`` (a ValueError, checked first)
    and writes the weight there (a ``.dat`` memmap per tensor plus
    ``index.json``, see `utils.offload`), leaving it on ``meta``; buffers go
    to disk only with ``offload_buffers``. ``offload_state_dict`` stages the
    CPU weights on disk while loading and reads them back at the end. Keys
    the model lacks are logged ("were not used when initializing"); tied
    groups split over devices are logged; ties are restored at the end.
    ``offload_8bit_bnb`` (quantizing 8-bit weights while offloading them) is
    not provided: a NotImplementedError (see `utils.bnb`).
    Catalog: save_model.reload, save_model.sharded, modeling.load_checkpoint_device_map.
    """
    if offload_8bit_bnb:  # utils.bnb: not provided, refused rather than silently unquantized
        raise NotImplementedError("accelerate_ref does not quantize weights while offloading them (offload_8bit_bnb)")
    checkpoint = os.fspath(checkpoint)  # HF fails on a PathLike naming a file ("no attribute 'endswith'")
    tied_params = find_tied_parameters(model)
    warn_if_untied(model, tied_params)
    if device_map is not None:
        check_tied_parameters_on_same_device(tied_params, device_map)
    to_disk = device_map is not None and "disk" in device_map.values()
    if to_disk and offload_folder is None:
        raise ValueError("At least one of the model submodule will be offloaded to disk, please pass along an `offload_folder`.")
    if to_disk:
        os.makedirs(offload_folder, exist_ok=True)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    files = checkpoint_files(checkpoint)
    offload_index: dict = {}
    staging = tempfile.mkdtemp() if offload_state_dict else None
    staged_index: dict = {}
    unexpected_keys: set[str] = set()
    model_keys = set(model.state_dict().keys())
    buffer_names = [name for name, _ in model.named_buffers()]
    physical_devices = {t.device for t in model.state_dict().values() if isinstance(t, torch.Tensor)} - {torch.device("meta")}
    for path in files:
        if device_map is None:
            loaded = _load_whole(model, path, len(physical_devices) <= 1, strict, full_state_dict, broadcast_from_rank0)
            unexpected_keys.update(set(loaded.keys()) - model_keys)
        else:
            loaded = load_state_dict(path, device_map=device_map)
            for param_name, param in loaded.items():
                if "SCB" in param_name:
                    continue
                if param_name not in model_keys:
                    unexpected_keys.add(param_name)
                    if not strict:
                        continue
                param_device = device_of(param_name, device_map)
                new_dtype = dtype
                if dtype is not None and torch.is_floating_point(param) and keep_in_fp32_modules is not None \
                        and dtype == torch.float16 and _keeps_fp32(param_name, keep_in_fp32_modules):
                    new_dtype = torch.float32
                statistics_name = param_name.replace("weight", "SCB")
                fp16_statistics = loaded[statistics_name] if "weight" in param_name and statistics_name in loaded \
                    and param.dtype == torch.int8 else None
                if param_device == "disk":
                    if offload_buffers or param_name not in buffer_names:
                        _offload(model, param, param_name, new_dtype, offload_folder, offload_index)
                elif param_device == "cpu" and staging is not None:
                    _offload(model, param, param_name, new_dtype, staging, staged_index)
                else:
                    set_module_tensor_to_device(model, param_name, param_device, value=param, dtype=new_dtype,
                                                fp16_statistics=fp16_statistics)
        del loaded
        gc.collect()
    if not strict and unexpected_keys:
        logger.warning(
            f"Some weights of the model checkpoint at {checkpoint} were not used when initializing "
            f"{model.__class__.__name__}: {unexpected_keys}. This may or may not be an issue - make sure that the "
            "checkpoint does not have unnecessary parameters, or that the model definition correctly corresponds to "
            "the checkpoint."
        )
    save_offload_index(offload_index, offload_folder)
    if staging is not None:
        load_offloaded_weights(model, staged_index, staging)
        shutil.rmtree(staging)
    retie_parameters(model, tied_params)


def _load_whole(model: torch.nn.Module, path: str, on_one_device: bool, strict: bool, full_state_dict: bool,
                broadcast_from_rank0: bool) -> dict[str, torch.Tensor]:
    """Load the file ``path`` into ``model`` without a device map; return what was read (empty on ranks that receive).

    A model on one device (``meta`` aside) goes through torch's
    ``set_model_state_dict`` (sharded DTensor weights included; with
    ``broadcast_from_rank0`` only rank 0 reads, torch sends the tensors);
    one spread over several devices through ``Module.load_state_dict``.
    """
    if not on_one_device:
        loaded = load_state_dict(path)
        model.load_state_dict(loaded, strict=strict)
        return loaded
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    loaded = load_state_dict(path) if not broadcast_from_rank0 or dist.get_rank() == 0 else {}
    options = StateDictOptions(full_state_dict=full_state_dict, strict=strict, broadcast_from_rank0=broadcast_from_rank0)
    set_model_state_dict(model, loaded, options=options)
    return loaded


def _offload(model: torch.nn.Module, param: torch.Tensor, param_name: str, new_dtype: Optional[torch.dtype],
             folder: Union[str, os.PathLike], index: dict) -> None:
    """Write ``param`` as loaded to ``folder`` (recorded in ``index``) and leave the model's tensor on ``meta`` in
    ``new_dtype`` (default: the loaded dtype)."""
    set_module_tensor_to_device(model, param_name, "meta", dtype=param.dtype if new_dtype is None else new_dtype)
    offload_weight(param, param_name, folder, index=index)


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model``, unwrapped from DDP / compile wrappers, is a ``peft.PeftModel``.

    Without `peft` it is what ``is_peft_available()`` says (falsy), as in HF.
    No catalog ID: API parity with HF accelerate 1.15.
    """
    from .imports import is_peft_available
    from .other import extract_model_from_parallel

    available = is_peft_available()
    if not available:
        return available
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
    ``meta`` afterwards (no weights anywhere) is left out, logged as a
    warning naming it; a module too big for the RAM is a MemoryError. The model's own direct weights (outside any submodule) are
    not included, as in HF. Catalog: bigmodel.cpu_offload, save_model.reload.
    """
    state_dict: dict[str, torch.Tensor] = {}
    on_meta: set[str] = set()
    for name, module in model.named_modules():
        if not name:
            continue
        try:
            with align_module_device(module, "cpu"):
                module_state = module.state_dict()
        except MemoryError:
            raise MemoryError("Offloaded module must fit in CPU memory to call save_model!") from None
        for key, tensor in module_state.items():
            if tensor.device == torch.device("meta"):
                on_meta.add(f"{name}.{key}")
            else:
                state_dict[f"{name}.{key}"] = tensor.to("cpu")
    left_out = {key for key in on_meta if key not in state_dict}
    if left_out:
        logger.warning(f"The following tensors were not saved because they were still on meta device: {left_out}")
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

    Rules: ``torch.autocast`` on the state's device type (``cuda`` for XLA on
    GPUs), in float16 for ``"fp16"``, bfloat16 for ``"bf16"`` and ``"fp8"``
    under the types of `_BF16_AUTOCAST_TYPES`, torch's default dtype for the
    device otherwise; ``autocast_kwargs`` (an `AutocastKwargs`) adds
    its arguments. Catalog: autocast.bf16.
    """
    from ..state import AcceleratorState
    from .dataclasses import DistributedType
    from .imports import is_torch_xla_available

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    if not native_amp:
        return contextlib.nullcontext()
    on_xla_gpu = state.distributed_type == DistributedType.XLA and is_torch_xla_available(check_is_gpu=True)
    device_type = "cuda" if on_xla_gpu else state.device.type
    if state.mixed_precision == "fp16":
        return torch.autocast(device_type=device_type, dtype=torch.float16, **kwargs)
    if state.mixed_precision in ("bf16", "fp8") and state.distributed_type.name in _BF16_AUTOCAST_TYPES:
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16, **kwargs)
    return torch.autocast(device_type=device_type, **kwargs)


#: The distributed types whose bf16 / fp8 runs autocast to bfloat16 (the others, DeepSpeed and Megatron-LM among
#: them, cast their own way and get the device's default autocast dtype).
_BF16_AUTOCAST_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_NPU",
                        "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON", "FSDP", "XLA")


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


def load_offloaded_weights(model: torch.nn.Module, index: Optional[dict], offload_folder: Union[str, os.PathLike]) -> None:
    """Put every weight of ``index`` (read from ``offload_folder``) into ``model`` on the CPU.

    Rules (HF 1.15's): each weight takes the dtype of the model's tensor
    (`set_module_tensor_to_device` without a ``dtype``); ``SCB`` entries are
    not weights, but a weight's ``SCB`` twin gives its 8-bit statistics; an
    empty or missing index does nothing. Catalog: modeling.offload_roundtrip.
    """
    if not index:
        return
    for name, info in index.items():
        if "SCB" in name:
            continue
        statistics = None
        if "weight" in name and name.replace("weight", "SCB") in index:
            scb = name.replace("weight", "SCB")
            statistics = load_offloaded_weight(os.path.join(offload_folder, f"{scb}.dat"), index[scb])
        weight = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)
