"""Placing a model's modules on accelerators, CPU and disk: `infer_auto_device_map` and its helpers.

Part of `accelerate_ref.utils.modeling` (re-exported there), with HF 1.15's
algorithm, messages and verbose output (the behaviour is the spec where the
documents are silent).

The four placement rules (catalog: modeling.device_map):
1. devices are filled in order: accelerators by index, then ``"cpu"``, then ``"disk"``;
2. no device's budget is exceeded (disk has none);
3. a module whose class is in ``no_split_module_classes`` (or with no
   children) is placed whole: when it does not fit, the next device takes it;
4. on accelerator 0 and on the CPU (the devices that execute or stage an
   offloaded layer) room for the largest layer still to place is kept free,
   so a layer offloaded to CPU (or disk) can be brought there for its forward.

Tied parameters are placed with the module that holds their twin (catalog:
modeling.tied_parameters).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Optional, Union

import torch
from torch import nn

from ..imports import is_mps_available
from .units import convert_file_size_to_int
from .sizes import (
    MaxMemory,
    accelerator_backend,
    check_tied_parameters_in_config,
    compute_module_sizes,
    compute_module_total_buffer_size,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
    get_module_leaves,
    get_module_size_with_ties,
    logger,
    top_level_entries,
)

DeviceMap = dict[str, Union[int, str, torch.device]]
Entry = tuple[str, Union[nn.Module, torch.Tensor]]
_NOT_TIED = "The model weights are not tied. Please use the `tie_weights` method before using the `infer_auto_device` function."


def warn_if_untied(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Log HF's warning when a 🤗 Transformers config asks for tied weights and the model has none tied."""
    if check_tied_parameters_in_config(model) and len(tied_params) == 0:
        logger.warning(_NOT_TIED)


def clean_device_map(device_map: DeviceMap, module_name: str = "") -> DeviceMap:
    """Merge the entries under ``module_name`` into one when they all share a device, then recurse into its children.

    Catalog: modeling.device_map (``clean_result``).
    """
    prefix = f"{module_name}." if module_name else ""
    under = [name for name in device_map if name.startswith(prefix)]
    if len(under) > 1 and len({device_map[name] for name in under}) == 1:
        device = device_map[under[0]]
        for name in under:
            del device_map[name]
        device_map[module_name] = device
    depth = module_name.count(".") + 2 if module_name else 1
    children = {".".join(name.split(".")[:depth]) for name in device_map if name.startswith(prefix) and len(name) > len(module_name)}
    for child in children:
        clean_device_map(device_map, child)
    return device_map


def reserving_devices(budget: dict) -> list:
    """The devices that keep room for the largest layer still to place (rule 4): accelerator 0 and the CPU.

    Accelerator 0 executes the layers offloaded to CPU or disk, and the CPU
    stages the layers read from disk; on Apple silicon ``mps`` alone.
    """
    gpus = [device for device in budget if device not in ("cpu", "disk")]
    return ["mps"] if "mps" in gpus else ([gpus[0], "cpu"] if gpus else ["cpu"])


def _as_list(no_split_module_classes: Optional[Union[str, list[str]]]) -> list[str]:
    if no_split_module_classes is None:
        return []
    return [no_split_module_classes] if isinstance(no_split_module_classes, str) else list(no_split_module_classes)


def _inside(name: str, other: str) -> bool:
    """Whether parameter ``other`` lies inside entry ``name`` (HF's test with trailing dots)."""
    return name + "." in other + "."


def _outside_twins(name: str, tied_parameters: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """The tied groups with members both inside and outside entry ``name``, and those outside members."""
    groups = [group for group in tied_parameters
              if any(_inside(name, p) for p in group) and not all(_inside(name, p) for p in group)]
    return groups, sum([[p for p in group if not _inside(name, p)] for group in groups], [])


def _children_of(module: Union[nn.Module, torch.Tensor]) -> list[tuple[str, nn.Module]]:
    return [] if isinstance(module, (nn.Parameter, torch.Tensor)) else list(module.named_children())


def _opened(name: str, module: nn.Module, with_buffers: bool = False) -> list[Entry]:
    """What replaces a split entry: its own parameters, then (``with_buffers``) its own buffers, then its children."""
    own = list(module.named_parameters(recurse=False)) + (list(module.named_buffers(recurse=False)) if with_buffers else [])
    return [(f"{name}.{child}", value) for child, value in own + list(module.named_children())]


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Optional[MaxMemory] = None,
    no_split_module_classes: Optional[Union[str, list[str]]] = None,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> DeviceMap:
    """A device map (an OrderedDict) for ``model`` within ``max_memory`` following the module's four rules.

    ``dtype`` and ``special_dtypes`` size the weights as they will be
    loaded; ``clean_result`` merges submodules sharing a device into their
    parent; ``verbose`` prints each decision in HF's words;
    ``fallback_allocation`` lets a device that would stay empty take the
    first module (breadth first) that fits it (`fallback_allocate`). The
    module that is split has its own buffers placed with its parameters (HF
    leaves them without a device; catalog modeling.device_map). The
    buffers of modules placed on CPU or disk that fit no accelerator's
    remaining memory are a UserWarning (unless ``offload_buffers``); devices
    left empty are logged at INFO with the memory they would need.
    Catalog: modeling.device_map, modeling.tied_parameters.
    """
    budget = get_max_memory(max_memory)
    no_split = _as_list(no_split_module_classes)
    devices = list(budget) + ([] if "disk" in budget else ["disk"])
    gpus = [device for device in devices if device not in ("cpu", "disk")]
    main_devices = reserving_devices(budget)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_parameters = find_tied_parameters(model)
    warn_if_untied(model, tied_parameters)
    pending: list[Entry] = top_level_entries(model)
    device_map: DeviceMap = OrderedDict()
    current = 0
    used = dict.fromkeys(devices, 0)
    buffer_sizes: dict = {}
    minimum_needed: dict = {}
    layer_size, layer_names = get_max_layer_size(pending, sizes, no_split)

    def say(message: str) -> None:
        if verbose:
            print(message)

    def largest_remaining() -> tuple[int, list[str]]:
        return get_max_layer_size([(n, m) for n, m in pending if isinstance(m, nn.Module)], sizes, no_split)

    while pending:
        name, module = pending.pop(0)
        say(f"\nTreating module {name}.")
        layer_names = [n for n in layer_names if n != name and not n.startswith(name + ".")]
        if not layer_names:
            layer_size, layer_names = largest_remaining()
        module_size = sizes[name]
        groups, twins = _outside_twins(name, tied_parameters)
        if groups:
            say(f"  Found the relevant tied param groups {groups}")
        if twins:
            say(f"  So those parameters need to be taken into account {twins}")
        device = devices[current]
        limit = budget[device] if device != "disk" else None
        reserved = 0
        if device in main_devices:
            limit, reserved = limit - layer_size, layer_size
        size_with_ties, twin_names, twin_modules = get_module_size_with_ties(twins, module_size, sizes, pending)
        if limit is None or used[device] + size_with_ties <= limit:
            if verbose:
                placed = f" and {twin_names}" if twin_names else f" (size={module_size})"
                room = f" (available={limit - used[device]})" if limit is not None else ""
                print(f"Putting {name}{placed}{room} on {device}.")
            used[device] += size_with_ties
            device_map[name] = device
            for twin_name in twin_names:
                if twin_name in [n for n, _ in pending]:
                    pending.pop(next(i for i, (n, _) in enumerate(pending) if n == twin_name))
                device_map[twin_name] = device
            if not offload_buffers and isinstance(module, nn.Module):
                buffer_sizes[device] = buffer_sizes.get(device, 0) + compute_module_total_buffer_size(
                    module, dtype=dtype, special_dtypes=special_dtypes)
            continue
        if twins and used[device] + module_size <= limit:
            say(f"Not enough space on {devices[current]} to put {name} and {twin_names} (space available "
                f"{limit - used[device]}, needed size {size_with_ties}).")
            split = False
            for twin_name, twin_module in zip(twin_names, twin_modules):
                if not list(twin_module.named_children()) or twin_module.__class__.__name__ in no_split:
                    continue
                say(f"Splitting {twin_name}.")
                index = [i for i, (n, _) in enumerate(pending) if n == twin_name][0]
                pending = [(name, module)] + pending[:index] + _opened(twin_name, twin_module) + pending[index + 1:]
                layer_size, layer_names = largest_remaining()
                split = True
                break
            if split:
                continue
            say("None of the tied module can be split, going to the next device.")
        if used[device] + module_size >= limit:
            children = _children_of(module)
            say(f"Not enough space on {devices[current]} to put {name} (space available "
                f"{limit - used[device]}, module size {module_size}).")
            if not children or module.__class__.__name__ in no_split:
                say("This module cannot be split, going to the next device.")
            else:
                say(f"Splitting {name}.")
                # Its own buffers are placed too: HF drops them, leaving them without a device (catalog
                # modeling.device_map; conformance case device_map_covers_every_weight, an XFAIL of HF's manifest).
                pending = _opened(name, module, with_buffers=True) + pending
                layer_size, layer_names = largest_remaining()
                continue
        if used[device] == 0 and fallback_allocation and device != "disk":
            room = budget[device] - max(layer_size, size_with_ties)
            found_name, found, rest = fallback_allocate(pending, sizes, room - used[device], no_split, tied_parameters)
            if found is not None:
                pending = [(found_name, found), (name, module)] + rest
                continue
        if used[device] == 0:
            minimum_needed[device] = size_with_ties + reserved
        used[device] += reserved
        current += 1
        pending = [(name, module)] + pending
    used = {device: amount for device, amount in used.items() if amount > 0}
    if clean_result:
        device_map = clean_device_map(device_map)
    _warn_about_offloaded_buffers(budget, used, buffer_sizes, gpus, offload_buffers)
    if minimum_needed:
        needs = "\n".join(f"  - {device}: {amount} bytes required" for device, amount in minimum_needed.items())
        logger.info(
            "Based on the current allocation process, no modules could be assigned to the following devices due to "
            f"insufficient memory:\n{needs}\nThese minimum requirements are specific to this allocation attempt and "
            "may vary. Consider increasing the available memory for these devices to at least the specified minimum, "
            "or adjusting the model config."
        )
    return device_map


def _warn_about_offloaded_buffers(budget: dict, used: dict, buffer_sizes: dict, gpus: list, offload_buffers: bool) -> None:
    """HF's UserWarning when the buffers of the modules placed on CPU or disk fit no accelerator's remaining memory."""
    offloaded = buffer_sizes.get("cpu", 0) + buffer_sizes.get("disk", 0)
    if offloaded <= 0 or offload_buffers:
        return
    fits = any(memory >= offloaded + used.get(device, 0) for device, memory in budget.items() if device not in ("cpu", "disk"))
    if gpus and not fits:
        warnings.warn(
            f"Current model requires {offloaded} bytes of buffer for offloaded layers, which seems does "
            "not fit any GPU's remaining memory. If you are experiencing a OOM later, please consider using "
            "offload_buffers=True."
        )


def get_balanced_memory(
    model: nn.Module,
    max_memory: Optional[MaxMemory] = None,
    no_split_module_classes: Optional[Union[str, list[str]]] = None,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    low_zero: bool = False,
) -> dict[Union[int, str], Union[int, float]]:
    """A ``max_memory`` that spreads ``model`` evenly over the accelerators, for `infer_auto_device_map`.

    Rules (HF 1.15's): each accelerator but the last gets the model's size
    divided by the accelerators' count (one fewer with ``low_zero``) plus a
    margin of 1.25 times the larger of the first ``no_split_module_classes``
    module of each class met among the sized names and the mean size of the
    smallest modules, capped by its own budget; the last keeps its budget.
    With ``low_zero`` accelerator 0 keeps only what the others cannot hold.
    One accelerator with no budget given keeps 90% of its free memory (a
    float; logged at INFO). Catalog: modeling.balanced_memory.
    """
    user_budget = max_memory is not None
    budget = get_max_memory(max_memory)
    kind = accelerator_backend()[0]
    kind = "mps" if kind == "cuda" and is_mps_available() else kind
    count = len([d for d in budget if (isinstance(d, int) or torch.device(d).type == kind) and budget[d] > 0])
    if count == 0:
        return budget
    if count == 1:
        low_zero = False
        if not user_budget:
            for key in budget:
                if isinstance(key, int):
                    budget[key] *= 0.9
                    logger.info(
                        f"We will use 90% of the memory on device {key} for storing the model, and 10% for the buffer "
                        "to avoid OOM. You can set `max_memory` in to a higher value to use more memory (at your own risk)."
                    )
                    break
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_gpu = sizes[""] // (count - 1 if low_zero else count)
    no_split = _as_list(no_split_module_classes)
    largest_no_split = 0
    if no_split:
        first_of_class: dict[str, int] = {}
        for name, size in sizes.items():
            if name == "":
                continue
            submodule = model
            for part in name.split("."):
                submodule = getattr(submodule, part)
            class_name = submodule.__class__.__name__
            if class_name in no_split and class_name not in first_of_class:
                first_of_class[class_name] = size
            if set(first_of_class) == set(no_split):
                break
        largest_no_split = max(first_of_class.values()) if first_of_class else 0
    leaves = set(get_module_leaves(sizes))
    modules_only = {n: v for n, v in sizes.items() if n not in leaves}
    final = get_module_leaves(modules_only)
    mean_leaf = int(sum(modules_only[n] for n in final) / max(len(final), 1))
    per_gpu += int(1.25 * max(largest_no_split, mean_leaf))
    gpus = sorted(d for d, memory in budget.items() if isinstance(d, int) and memory > 0)
    for index in gpus[:-1]:
        budget[index] = min(budget[0] if low_zero and index == 0 else per_gpu, budget[index])
    if low_zero:
        budget[0] = min(max(0, sizes[""] - sum(budget[i] for i in range(1, count))), budget[0])
    return budget


def check_device_map(model: nn.Module, device_map: DeviceMap) -> None:
    """Check that ``device_map`` gives a device to every weight of ``model``.

    Rules (HF 1.15's): a key other than ``""`` that names no submodule (a
    weight's name included) is a UserWarning listing them; weights left
    without a device are a ValueError listing them; ``""`` covers all.
    Catalog: bigmodel.dispatch_model.
    """
    modules = dict(model.named_modules())
    unknown = [key for key in device_map if key != "" and key not in modules]
    if unknown:
        warnings.warn(f"The following device_map keys do not match any submodules in the model: {unknown}", UserWarning)
    uncovered = [] if "" in device_map else [
        name for name in model.state_dict() if not any(name == key or name.startswith(key + ".") for key in device_map)]
    if uncovered:
        raise ValueError(
            f"The device_map provided does not give any device for the following parameters: {', '.join(uncovered)}"
        )


def device_of(name: str, device_map: DeviceMap) -> Union[int, str, torch.device]:
    """The device ``device_map`` gives weight ``name``: that of its longest dotted prefix in the map (``""`` last).

    A name no key covers is HF's ValueError ("<name> doesn't have any device
    set."). Catalog: modeling.load_checkpoint_device_map.
    """
    module_name = name
    while module_name and module_name not in device_map:
        module_name = module_name.rpartition(".")[0]
    if module_name == "" and "" not in device_map:
        raise ValueError(f"{name} doesn't have any device set.")
    return device_map[module_name]


def _tied_device(name: str, device_map: DeviceMap) -> Union[int, str, torch.device]:
    """The device of ``name``'s longest prefix in the map; none is HF's ValueError naming the last prefix tried ("")."""
    while name not in device_map:
        parent = name.rpartition(".")[0]
        if parent == name:
            raise ValueError(f"The `device_map` does not contain the module {name}.")
        name = parent
    return device_map[name]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: DeviceMap) -> None:
    """Log a warning when the parameters of one tied group are given different devices by ``device_map``.

    Rule (HF 1.15's): each name's device is that of its longest prefix in the
    map; a group spanning several devices is logged (one warning per group)
    with each name's device. Nothing is moved. Catalog: modeling.tied_parameters.
    """
    for group in tied_params:
        devices = {name: _tied_device(name, device_map) for name in group}
        if len(set(devices.values())) > 1:
            logger.warning(
                f"Tied parameters are on different devices: {devices}. "
                "Please modify your custom device map or set `device_map='auto'`. "
            )


def fallback_allocate(
    modules: list[Entry],
    module_sizes: dict[str, int],
    size_limit: Union[int, str],
    no_split_module_classes: Optional[list[str]] = None,
    tied_parameters: Optional[list[list[str]]] = None,
) -> tuple[Optional[str], Optional[Union[nn.Module, torch.Tensor]], list[Entry]]:
    """The first module, breadth first through ``modules``, that fits in ``size_limit``, and the entries left.

    Rules (HF 1.15's): an entry fits when its size plus that of the modules
    holding the twins of its tied parameters (`get_module_size_with_ties`)
    is at most ``size_limit`` (bytes, or a string such as ``"1GB"``; an
    unreadable limit finds nothing). An entry too big is opened (its own
    parameters, then its children) unless it is a tensor, has no children or
    its class is in ``no_split_module_classes``. Returns ``(name, module,
    rest)`` where ``rest`` is ``modules`` with the found entry's ancestors
    replaced by their parameters and children and the entry removed (a
    top-level entry is popped from ``modules`` itself, as HF does); nothing
    found: ``(None, None, modules)``. Catalog: modeling.device_map.
    """

    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split, groups = no_split_module_classes or [], tied_parameters or []
    to_search = modules.copy()
    while to_search:
        name, module = to_search.pop(0)
        _, twins = _outside_twins(name, groups)
        size, _, _ = get_module_size_with_ties(twins, module_sizes[name], module_sizes, to_search)
        if size <= limit:
            break
        children = _children_of(module)
        if children and module.__class__.__name__ not in no_split:
            to_search = _opened(name, module) + to_search
    else:
        return None, None, modules
    for end in [index for index, char in enumerate(name) if char == "."]:
        names = [n for n, _ in modules]
        if name[:end] in names:
            position = names.index(name[:end])
            modules = modules[:position] + _opened(name[:end], modules[position][1]) + modules[position + 1:]
    found = [n for n, _ in modules].index(name)
    name, module = modules.pop(found)
    return name, module, modules
