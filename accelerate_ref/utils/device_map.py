"""Placing a model's modules on accelerators, CPU and disk: `infer_auto_device_map` and its helpers.

Part of `accelerate_ref.utils.modeling` (re-exported there).

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
from typing import Optional, Union

import torch
from torch import nn

from .module_sizes import (
    MaxMemory,
    compute_module_sizes,
    compute_module_total_buffer_size,
    find_tied_parameters,
    get_max_layer_size,
    get_module_leaves,
    get_module_size_with_ties,
    get_max_memory,
    top_level_entries,
)

DeviceMap = dict[str, Union[int, str, torch.device]]
Entry = tuple[str, Union[nn.Module, torch.Tensor]]


def _is_prefix(prefix: str, name: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


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


def _accelerators(budget: dict) -> list[int]:
    return [device for device in budget if device not in ("cpu", "disk", "mps")]


def reserving_devices(budget: dict) -> list:
    """The devices that keep room for the largest layer still to place (rule 4): accelerator 0 and the CPU.

    Accelerator 0 executes the layers offloaded to CPU or disk, and the CPU
    stages the layers read from disk; on Apple silicon ``mps`` alone.
    """
    accelerators = _accelerators(budget)
    return ["mps"] if "mps" in budget else ([accelerators[0], "cpu"] if accelerators else ["cpu"])


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
    """A device map for ``model`` within ``max_memory`` following the module's four rules.

    ``dtype`` and ``special_dtypes`` size the weights as they will be
    loaded; ``clean_result`` merges submodules sharing a device into their
    parent; ``verbose`` prints each decision. ``fallback_allocation`` is
    accepted for compatibility and changes nothing here.
    Catalog: modeling.device_map, modeling.tied_parameters.
    """
    budget = get_max_memory(None if max_memory is None else dict(max_memory))
    no_split = [no_split_module_classes] if isinstance(no_split_module_classes, str) else list(no_split_module_classes or [])
    devices = list(budget) + ([] if "disk" in budget else ["disk"])
    accelerators = _accelerators(budget)
    reserving = reserving_devices(budget)
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    tied_groups = find_tied_parameters(model)
    pending: list[Entry] = top_level_entries(model)
    used = dict.fromkeys(devices, 0)
    buffer_bytes: dict = {}
    device_map: DeviceMap = {}
    current = 0
    layer_size, layer_names = get_max_layer_size(pending, sizes, no_split)

    def say(message: str) -> None:
        if verbose:
            print(message)

    def remaining_largest_layer() -> tuple[int, list[str]]:
        return get_max_layer_size([(n, m) for n, m in pending if isinstance(m, nn.Module)], sizes, no_split)

    while pending:
        name, module = pending.pop(0)
        say(f"Treating {name}.")
        layer_names = [n for n in layer_names if not _is_prefix(name, n)]
        if not layer_names:
            layer_size, layer_names = remaining_largest_layer()
        size = sizes[name]
        twins = [p for group in tied_groups if any(_is_prefix(name, p) for p in group) and not all(_is_prefix(name, p) for p in group) for p in group if not _is_prefix(name, p)]
        twin_modules = [next(entry for entry in pending if _is_prefix(entry[0], twin)) for twin in twins]
        size_with_twins = size + sum(sizes[entry[0]] - sizes[twin] for twin, entry in zip(twins, twin_modules))
        device = devices[current]
        reserve = layer_size if device in reserving else 0
        limit = None if device == "disk" else budget[device] - reserve
        if limit is None or used[device] + size_with_twins <= limit:
            say(f"Putting {name} ({size_with_twins} bytes with tied modules) on {device}.")
            used[device] += size_with_twins
            device_map[name] = device
            for twin_name, _ in twin_modules:
                pending = [entry for entry in pending if entry[0] != twin_name]
                device_map[twin_name] = device
            if not offload_buffers and isinstance(module, nn.Module):
                buffer_bytes[device] = buffer_bytes.get(device, 0) + compute_module_total_buffer_size(module, dtype, special_dtypes)
            continue
        if twins and used[device] + size <= limit:
            splittable = [(n, m) for n, m in twin_modules if list(m.named_children()) and m.__class__.__name__ not in no_split]
            if splittable:
                twin_name, twin_module = splittable[0]
                say(f"Not enough room on {device} for {name} with {twin_name}: splitting {twin_name}.")
                opened = [(f"{twin_name}.{n}", m) for n, m in list(twin_module.named_parameters(recurse=False)) + list(twin_module.named_children())]
                index = next(i for i, entry in enumerate(pending) if entry[0] == twin_name)
                pending = [(name, module)] + pending[:index] + opened + pending[index + 1 :]
                layer_size, layer_names = remaining_largest_layer()
                continue
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if children and module.__class__.__name__ not in no_split:
            say(f"Not enough room on {device} for {name} ({size} bytes): splitting it.")
            # Its own buffers go with it too (🤗 Accelerate 1.15 drops them, leaving them without a device).
            opened = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)) + children
            pending = [(f"{name}.{n}", m) for n, m in opened] + pending
            layer_size, layer_names = remaining_largest_layer()
            continue
        say(f"Not enough room on {device} for {name} ({size} bytes), which cannot be split: next device.")
        used[device] += reserve
        current += 1
        pending.insert(0, (name, module))
    if clean_result:
        device_map = clean_device_map(device_map)
    offloaded_buffers = buffer_bytes.get("cpu", 0) + buffer_bytes.get("disk", 0)
    if offloaded_buffers and accelerators and not any(budget[a] >= offloaded_buffers + used[a] for a in accelerators):
        warnings.warn(
            f"the buffers of offloaded modules take {offloaded_buffers} bytes, more than any accelerator has left; "
            "pass offload_buffers=True if this runs out of memory"
        )
    return device_map


def get_balanced_memory(
    model: nn.Module,
    max_memory: Optional[MaxMemory] = None,
    no_split_module_classes: Optional[Union[str, list[str]]] = None,
    dtype: Union[str, torch.dtype, None] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    low_zero: bool = False,
) -> dict[Union[int, str], int]:
    """A ``max_memory`` that spreads ``model`` evenly over the accelerators, for `infer_auto_device_map`.

    Rules: each accelerator but the last gets the model's size divided by
    the accelerators' count (one fewer with ``low_zero``) plus a margin of
    1.25 times the larger of the biggest ``no_split_module_classes`` module
    and the mean size of the smallest modules, capped by its own budget;
    the last keeps its budget. With ``low_zero`` accelerator 0 keeps only
    what the others cannot hold. One accelerator with no budget given keeps
    90% of its free memory. Catalog: modeling.balanced_memory.
    """
    user_budget = max_memory is not None
    budget = get_max_memory(None if max_memory is None else dict(max_memory))
    accelerators = sorted(a for a in _accelerators(budget) if budget[a] > 0)
    if not accelerators:
        return budget
    if len(accelerators) == 1:
        low_zero = False
        if not user_budget:
            budget[accelerators[0]] = int(budget[accelerators[0]] * 0.9)
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    per_device = sizes[""] // (len(accelerators) - 1 if low_zero else len(accelerators))
    no_split = [no_split_module_classes] if isinstance(no_split_module_classes, str) else list(no_split_module_classes or [])
    no_split_largest = 0
    seen_classes: set[str] = set()
    for name, submodule in model.named_modules():
        class_name = submodule.__class__.__name__
        if name and class_name in no_split and class_name not in seen_classes:
            seen_classes.add(class_name)  # the first module of each class stands for it
            no_split_largest = max(no_split_largest, sizes.get(name, 0))
    modules_only = {n: s for n, s in sizes.items() if n not in set(get_module_leaves(sizes))}
    leaves = get_module_leaves(modules_only)
    mean_leaf = int(sum(modules_only[n] for n in leaves) / max(len(leaves), 1))
    per_device += int(1.25 * max(no_split_largest, mean_leaf))
    for accelerator in accelerators[:-1]:
        budget[accelerator] = min(budget[0] if low_zero and accelerator == 0 else per_device, budget[accelerator])
    if low_zero:
        rest = sum(budget[a] for a in accelerators[1:])
        budget[0] = min(max(0, sizes[""] - rest), budget[0])
    return budget


def check_device_map(model: nn.Module, device_map: DeviceMap) -> None:
    """Check that ``device_map`` names only modules of ``model`` and gives a device to every weight.

    A key that is neither ``""`` nor a module or weight of the model is a
    ValueError naming it; weights left without a device are a ValueError
    listing them. Catalog: bigmodel.dispatch_model.
    """
    known = set(dict(model.named_modules())) | set(model.state_dict())
    unknown = [key for key in device_map if key != "" and key not in known]
    if unknown:
        raise ValueError(f"device_map names modules the model does not have: {unknown}")
    uncovered = [name for name in model.state_dict() if not any(_is_prefix(key, name) for key in device_map)]
    if uncovered:
        raise ValueError(f"device_map gives no device to these weights: {', '.join(uncovered)}")


def device_of(name: str, device_map: DeviceMap) -> Union[int, str, torch.device]:
    """The device ``device_map`` gives weight or module ``name``: its longest matching module prefix ("" matches all).

    A name no key covers is a ValueError naming it. Catalog: modeling.load_checkpoint_device_map.
    """
    prefixes = [key for key in device_map if _is_prefix(key, name)]
    if not prefixes:
        raise ValueError(f"device_map gives no device to {name}; add its module (or '') to the map")
    return device_map[max(prefixes, key=len)]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: DeviceMap) -> None:
    """Warn when the parameters of one tied group are given different devices by ``device_map``.

    Rule: each name's device is that of its longest module prefix in the
    map (`device_of`); a group spanning several devices is a UserWarning
    listing each name's device (one per group). Nothing is moved.
    Catalog: modeling.tied_parameters.
    """
    for group in tied_params:
        devices = {name: device_of(name, device_map) for name in group}
        if len(set(devices.values())) > 1:
            warnings.warn(f"tied parameters are on different devices: {devices}; change the device_map or use device_map='auto'")


def fallback_allocate(
    modules: list[Entry],
    module_sizes: dict[str, int],
    size_limit: Union[int, str],
    no_split_module_classes: Optional[list[str]] = None,
    tied_parameters: Optional[list[list[str]]] = None,
) -> tuple[Optional[str], Optional[Union[nn.Module, torch.Tensor]], list[Entry]]:
    """The first module, breadth first through ``modules``, that fits in ``size_limit``, and the entries left.

    Rules: an entry fits when its size plus that of the modules holding
    the twins of its tied parameters (`get_module_size_with_ties`) is at
    most ``size_limit`` (bytes, or a string such as ``"1GB"``; an unreadable
    limit finds nothing). An entry too big is opened (its own parameters,
    then its children) unless it is a tensor, has no children or its class
    is in ``no_split_module_classes``. Returns ``(name, module, rest)``
    where ``rest`` is ``modules`` with the found entry's ancestors replaced
    by their parameters and children and the entry removed (``modules``
    itself is left unchanged; HF's may be changed); nothing found:
    ``(None, None, modules)``. A twin whose module is no longer among the
    candidates is a ValueError naming it. Catalog: modeling.device_map.
    """
    from .modeling import convert_file_size_to_int

    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split, groups = no_split_module_classes or [], tied_parameters or []
    to_search = list(modules)
    while to_search:
        name, module = to_search.pop(0)
        inside = [group for group in groups if any(_is_prefix(name, p) for p in group) and not all(_is_prefix(name, p) for p in group)]
        twins = [p for group in inside for p in group if not _is_prefix(name, p)]
        size, _, _ = get_module_size_with_ties(twins, module_sizes[name], module_sizes, to_search)
        if size <= limit:
            break
        children = [] if isinstance(module, torch.Tensor) else list(module.named_children())
        if children and module.__class__.__name__ not in no_split:
            opened = list(module.named_parameters(recurse=False)) + children
            to_search = [(f"{name}.{child}", value) for child, value in opened] + to_search
    else:
        return None, None, modules
    rest = list(modules)
    for end in [index for index, char in enumerate(name) if char == "."]:
        names = [n for n, _ in rest]
        if name[:end] in names:
            position = names.index(name[:end])
            parent = rest[position][1]
            opened = list(parent.named_parameters(recurse=False)) + list(parent.named_children())
            rest[position : position + 1] = [(f"{name[:end]}.{child}", value) for child, value in opened]
    found = [n for n, _ in rest].index(name)
    return name, rest.pop(found)[1], rest
