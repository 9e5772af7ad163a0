"""Catalog rows modeling.* of "Utilities" and "Big-model inference": sizes, budgets, device maps, ties, offload files.

Device maps are computed for accelerators by index (``0``, ``1``, ...)
without needing them: placement reads only shapes. Every expected size is
counted by hand from the tensors (`bigmodel_models.hand_sizes`).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from ..engine.case import case
from ..support.checks import expect_equal, expect_raises, expect_tensor, expect_true
from ..support.models import Net, built, hand_sizes, owner_of


def _modeling(impl):
    return impl.utils.modeling


# -- modeling.sizes ----------------------------------------------------------------


@case("modeling.sizes", worlds=[1])
def sizes_by_hand(impl, world):
    """Sizes of every module, with ``dtype`` (floats only) and ``special_dtypes``; layers and the largest one."""
    modeling = _modeling(impl)
    model = built(width=8, depth=2)
    sizes = modeling.compute_module_sizes(model)
    by_hand = hand_sizes(model)
    for name in ("", "embed", "blocks", "blocks.0", "blocks.0.a", "head"):
        expect_equal(sizes[name], by_hand[name], f"compute_module_sizes()[{name!r}]")
    half = modeling.compute_module_sizes(model, dtype=torch.float16)
    for name, size in hand_sizes(model, torch.float16).items():
        expect_equal(half[name], size, f"compute_module_sizes(dtype=float16)[{name!r}] (int64 buffers keep 8 bytes)")
    special = modeling.compute_module_sizes(model, special_dtypes={"head.weight": torch.float16})
    expect_equal(special["head"], by_hand["head"] // 2, "special_dtypes halves head.weight only")
    expect_equal(special["embed"], by_hand["embed"], "special_dtypes leaves other weights alone")
    # Layers: leaves (Linear, Embedding) unless a class is kept whole.
    entries = list(model.named_children())
    largest, names = modeling.get_max_layer_size(entries, sizes, [])
    leaf_sizes = {n: by_hand[n] for n in ("embed", "head", "blocks.0.a", "blocks.0.b", "blocks.1.a", "blocks.1.b")}
    expect_equal(largest, max(leaf_sizes.values()), "get_max_layer_size over leaves")
    expect_equal(sorted(names), sorted(n for n, s in leaf_sizes.items() if s == largest), "names of the largest leaves")
    largest, names = modeling.get_max_layer_size(entries, sizes, ["Block"])
    expect_equal((largest, sorted(names)), (by_hand["blocks.0"], ["blocks.0", "blocks.1"]), "a Block kept whole is one layer")
    model._no_split_modules = ["Block"]
    total, (largest, names) = modeling.calculate_maximum_sizes(model)
    expect_equal((total, largest, sorted(names)), (by_hand[""], by_hand["blocks.0"], ["blocks.0", "blocks.1"]), "calculate_maximum_sizes")


# -- modeling.max_memory_strings -----------------------------------------------------


@case("modeling.sizes", worlds=[1], level="hf-1.15")
def total_buffer_size(impl, world):
    """HF 1.15's ``compute_module_total_buffer_size`` (in neither document): the bytes of every buffer."""
    model = built(width=8, depth=2)
    buffers = _modeling(impl).compute_module_total_buffer_size(model)
    expect_equal(buffers, sum(b.numel() * b.element_size() for b in model.buffers()), "compute_module_total_buffer_size")


@case("modeling.max_memory_strings", worlds=[1])
def max_memory_strings(impl, world):
    """Ints are bytes; decimal and binary units; keys ordered accelerators, then cpu, then disk."""
    modeling = _modeling(impl)
    budget = modeling.get_max_memory({"disk": "2GB", "cpu": "10KB", 1: "500MiB", 0: 1234, 2: "3GiB", 3: "7MB"})
    expected = {0: 1234, 1: 500 * 2**20, 2: 3 * 2**30, 3: 7 * 10**6, "cpu": 10**4, "disk": 2 * 10**9}
    expect_equal(budget, expected, "get_max_memory converts every value")
    expect_equal(list(budget), [0, 1, 2, 3, "cpu", "disk"], "get_max_memory orders the devices")
    expect_equal(modeling.convert_file_size_to_int("64MB"), 64 * 10**6, "convert_file_size_to_int('64MB')")
    expect_raises(lambda: modeling.get_max_memory({"gpu7": "1GB"}), ValueError, "an unknown device key")


# -- modeling.device_map -------------------------------------------------------------


def _placed(model, device_map, sizes) -> dict:
    """Bytes placed per device (each weight counted once, where the map puts it)."""
    used: dict = {}
    seen: set[int] = set()
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        device = owner_of(name, device_map)
        if device is None:
            continue  # a weight without a device: device_map_covers_every_weight reports it
        used[device] = used.get(device, 0) + tensor.numel() * tensor.element_size()
    return used


def _layers(model, no_split) -> dict[str, int]:
    """Layers (leaves, or modules of a no-split class) with their hand sizes."""
    sizes = hand_sizes(model)
    layers = {}
    for name, module in model.named_modules():
        if not name or any(name.startswith(other + ".") for other in layers):
            continue
        if not list(module.children()) or module.__class__.__name__ in no_split:
            layers[name] = sizes.get(name, 0)
    return layers


def _check_rules(model, device_map, budget, no_split, what: str) -> None:
    order = [d for d in budget] + ([] if "disk" in budget else ["disk"])
    sizes = hand_sizes(model)
    names = list(model.state_dict())  # module order, parameters and buffers together
    devices = [order.index(owner_of(name, device_map)) for name in names if owner_of(name, device_map) is not None]
    expect_equal(devices, sorted(devices), f"{what}: devices are filled in order {order}: {device_map}")
    used = _placed(model, device_map, sizes)
    for device, size in used.items():
        if device != "disk":
            expect_true(size <= budget[device], f"{what}: {size} bytes on {device} exceed its budget {budget[device]}: {device_map}")
    for key in device_map:
        inside = [cls for cls in no_split for name, module in model.named_modules() if key.startswith(name + ".") and module.__class__.__name__ == cls and name]
        expect_true(not inside, f"{what}: {key!r} splits a {inside} kept whole by no_split_module_classes: {device_map}")
    layers = _layers(model, no_split)
    for spill, host in (("cpu", 0), ("disk", "cpu")):
        offloaded = [size for name, size in layers.items() if owner_of(name, device_map) == spill]
        if offloaded and host in budget:
            room = budget[host] - used.get(host, 0)
            expect_true(  # a host smaller than that layer can hold nothing else
                room >= min(max(offloaded), budget[host]),
                f"{what}: with layers on {spill}, {host} keeps room for the largest of them ({max(offloaded)} bytes); "
                f"it has {room} left: {device_map}",
            )


@case("modeling.device_map", worlds=[1])
def device_map_rules(impl, world):
    """Order, budgets, no-split modules and the reserve of accelerator 0 / CPU, over a sweep of budgets."""
    modeling = _modeling(impl)
    model = built(width=16, depth=4)
    block = hand_sizes(model)["blocks.0"]
    checked = 0
    for gpus in (1, 2, 3):
        for per_gpu in (block // 2, block, int(1.6 * block), 3 * block):
            for cpu in (block, 2 * block, 3 * block):
                for no_split in ([], ["Block"]):
                    budget = {index: per_gpu for index in range(gpus)} | {"cpu": cpu}
                    device_map = modeling.infer_auto_device_map(model, dict(budget), no_split_module_classes=no_split)
                    _check_rules(model, device_map, budget, no_split, f"budget {budget}, no_split {no_split}")
                    checked += 1
    expect_true(checked == 72, "every budget of the sweep was checked")


@case("modeling.device_map", worlds=[1])
def device_map_covers_every_weight(impl, world):
    """A module split over two devices still gives a device to each of its own buffers (`check_device_map` passes)."""
    modeling = _modeling(impl)
    model = built(width=16, depth=4)
    block = hand_sizes(model)["blocks.0"]
    device_map = modeling.infer_auto_device_map(model, {0: block, "cpu": block})
    uncovered = [name for name in model.state_dict() if owner_of(name, device_map) is None]
    expect_equal(uncovered, [], f"weights without a device in {device_map}")
    modeling.check_device_map(model, device_map)


@case("modeling.device_map", worlds=[1])
def device_map_spills_and_cleans(impl, world):
    """A model that fits stays on accelerator 0 (``{'': 0}``); ``clean_result=False`` lists modules; spills go CPU then disk."""
    modeling = _modeling(impl)
    model = built(width=16, depth=4)
    sizes = hand_sizes(model)
    expect_equal(modeling.infer_auto_device_map(model, {0: 10**6, "cpu": 10**6}), {"": 0}, "everything fits on 0, cleaned")
    raw = modeling.infer_auto_device_map(model, {0: 10**6, "cpu": 10**6}, clean_result=False)
    expect_equal(sorted(raw), ["blocks", "embed", "head"], "clean_result=False keeps the top-level modules")
    expect_equal(set(raw.values()), {0}, "clean_result=False: all on 0")
    budget = {0: sizes["blocks.0"] * 2, "cpu": sizes["blocks.0"] * 2}
    device_map = modeling.infer_auto_device_map(model, dict(budget), no_split_module_classes=["Block"])
    expect_true({0, "cpu", "disk"} <= set(device_map.values()), f"a small budget spills to cpu and disk: {device_map}")
    _check_rules(model, device_map, budget, ["Block"], "spill")
    half = modeling.infer_auto_device_map(model, {0: sizes[""] // 2 + sizes["blocks.0"], "cpu": 10**6}, dtype=torch.float16)
    expect_equal(half, {"": 0}, "with dtype=float16 the model takes half the bytes and fits")


# -- modeling.balanced_memory --------------------------------------------------------


@case("modeling.balanced_memory", worlds=[1])
def balanced_memory(impl, world):
    """Balanced budgets spread the blocks over four accelerators; ``low_zero`` keeps accelerator 0 nearly empty."""
    modeling = _modeling(impl)
    model = built(width=16, depth=8)
    plenty = {index: 10**6 for index in range(4)} | {"cpu": 10**6}
    balanced = modeling.get_balanced_memory(model, dict(plenty), no_split_module_classes=["Block"])
    expect_true(all(balanced[i] < plenty[i] for i in range(3)), f"budgets of 0..2 are cut to a share: {balanced}")
    device_map = modeling.infer_auto_device_map(model, balanced, no_split_module_classes=["Block"])
    sizes = hand_sizes(model)
    used = _placed(model, device_map, sizes)
    expect_true(len(used) >= 3, f"the blocks spread over at least three of the four accelerators: {device_map}")
    share = sizes[""] / 4 + 2 * sizes["blocks.0"]
    expect_true(max(used.values()) <= share, f"no accelerator holds much more than a quarter: {used}")
    low = modeling.get_balanced_memory(model, dict(plenty), no_split_module_classes=["Block"], low_zero=True)
    low_map = modeling.infer_auto_device_map(model, low, no_split_module_classes=["Block"])
    low_used = _placed(model, low_map, hand_sizes(model))
    expect_true(
        low_used.get(0, 0) < min(low_used.get(i, 0) for i in (1, 2, 3)),
        f"low_zero: accelerator 0 holds less than each other one: {low_used}",
    )


# -- modeling.tied_parameters --------------------------------------------------------


@case("modeling.tied_parameters", worlds=[1])
def tied_parameters(impl, world):
    """Groups of tied weights; one device per group in any map; `retie_parameters` makes them one Parameter again."""
    modeling = _modeling(impl)
    model = built(width=16, depth=4, tie=True)
    expect_equal(modeling.find_tied_parameters(model), [["embed.weight", "head.weight"]], "find_tied_parameters")
    expect_equal(modeling.find_tied_parameters(built()), [], "no ties, no groups")
    sizes = hand_sizes(model)
    for budget in ({0: sizes["blocks.0"] * 2, 1: 10**6, "cpu": 10**6}, {0: sizes["embed"] + 8, "cpu": 10**6}):
        device_map = modeling.infer_auto_device_map(model, budget, no_split_module_classes=["Block"])
        expect_equal(owner_of("head.weight", device_map), owner_of("embed.weight", device_map), f"tied pair on one device: {device_map}")
    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())
    modeling.retie_parameters(model, [["embed.weight", "head.weight"]])
    expect_true(model.head.weight is model.embed.weight, "retie_parameters: head.weight is embed.weight again (not a copy)")
    expect_equal(modeling.find_tied_parameters(model), [["embed.weight", "head.weight"]], "tied again")



@case("modeling.tied_parameters", worlds=[1])
def load_checkpoint_reties(impl, world):
    """`load_checkpoint_in_model` with a device map restores the ties loading broke: the tied weights are one
    Parameter again, holding the checkpoint's values.

    Loading puts a new tensor under each name it reads, which unties a
    group; the loader ties it again at the end. Two checkpoints into an
    empty tied model: a pickle holding both names, and a safetensors file
    holding one name per shared tensor (as a tied model is saved, the
    other name left to the tie).
    """
    modeling = _modeling(impl)
    reference = built(width=8, depth=1, tie=True)
    state = reference.state_dict()
    both = os.path.join(world.shared_dir, "tied.bin")
    torch.save(state, both)
    one = os.path.join(world.shared_dir, "tied.safetensors")
    save_file({k: v.contiguous() for k, v in state.items() if k != "head.weight"}, one, metadata={"format": "pt"})
    for checkpoint, what in ((both, "a pickle with both names"), (one, "a safetensors file with embed.weight only")):
        with impl.part("big_modeling").init_empty_weights():
            model = Net(width=8, depth=1)
        model.head.weight = model.embed.weight  # tied after the build, as a model's tie_weights() does
        modeling.load_checkpoint_in_model(model, checkpoint, device_map={"": "cpu"})
        expect_true(model.head.weight is model.embed.weight, f"{what}: head.weight is embed.weight after loading (tied again)")
        expect_tensor(model.head.weight, reference.embed.weight, f"{what}: the tied weight holds the checkpoint's values")
        expect_equal(modeling.find_tied_parameters(model), [["embed.weight", "head.weight"]], f"{what}: find_tied_parameters")


# -- modeling.tensor_to_device -------------------------------------------------------


@case("modeling.tensor_to_device", worlds=[1])
def tensor_to_device(impl, world):
    """Replace a parameter (from ``meta`` too) with ``value`` and ``dtype``; buffers; a tie restored by retie."""
    modeling = _modeling(impl)
    big_modeling = impl.part("big_modeling")
    with big_modeling.init_empty_weights():
        model = Net(width=4, depth=1)
    model.head.weight = model.embed.weight  # tied after the build, as a model's tie_weights() does
    tied = modeling.find_tied_parameters(model)
    expect_raises(lambda: modeling.set_module_tensor_to_device(model, "blocks.0.a.weight", "cpu"), ValueError, "meta without a value")
    value = torch.arange(16.0).reshape(4, 4)
    modeling.set_module_tensor_to_device(model, "blocks.0.a.weight", "cpu", value=value)
    weight = model.blocks[0].a.weight
    expect_true(isinstance(weight, torch.nn.Parameter) and weight.requires_grad, "still a Parameter that requires grad")
    expect_tensor(weight, value, "the value was set")
    modeling.set_module_tensor_to_device(model, "blocks.0.a.bias", "cpu", value=torch.ones(4, dtype=torch.float64))
    expect_equal(model.blocks[0].a.bias.dtype, torch.float32, "without dtype the value takes the old dtype")
    modeling.set_module_tensor_to_device(model, "blocks.0.b.weight", "cpu", value=value, dtype=torch.float16)
    expect_equal(model.blocks[0].b.weight.dtype, torch.float16, "dtype=float16 casts the value")
    modeling.set_module_tensor_to_device(model, "blocks.0.shift", "cpu", value=torch.full((4,), 2.0))
    expect_tensor(model.blocks[0].shift, torch.full((4,), 2.0), "a buffer is set too")
    expect_raises(
        lambda: modeling.set_module_tensor_to_device(model, "blocks.0.a.weight", "cpu", value=torch.ones(3, 3)),
        ValueError,
        "a value of the wrong shape",
    )
    embedding = torch.ones(10, 4)
    modeling.set_module_tensor_to_device(model, "embed.weight", "cpu", value=embedding)
    modeling.retie_parameters(model, tied)
    expect_true(model.head.weight is model.embed.weight, "tied weights are one Parameter after retie_parameters")
    expect_tensor(model.head.weight, embedding, "the tied twin holds the new value")


# -- modeling.offload_roundtrip ------------------------------------------------------


@case("modeling.offload_roundtrip", worlds=[1])
def offload_roundtrip(impl, world):
    """One ``.dat`` memmap per tensor and an ``index.json``; loading back is bit-exact (fp32, bf16, int64, 0-d)."""
    offload = impl.utils.offload
    modeling = _modeling(impl)
    folder = os.path.join(world.shared_dir, "offload")
    model = built(width=8, depth=1)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    state["blocks.0.count"] = torch.arange(8, dtype=torch.int64)
    offload.offload_state_dict(folder, state)
    with open(os.path.join(folder, "index.json"), encoding="utf-8") as stream:
        index = json.load(stream)
    expect_equal(sorted(index), sorted(state), "index.json lists every tensor")
    for name, tensor in state.items():
        path = os.path.join(folder, f"{name}.dat")
        expect_equal(os.path.getsize(path), tensor.numel() * tensor.element_size(), f"{name}.dat holds the raw bytes")
    target = built(seed=1, width=8, depth=1)
    modeling.load_offloaded_weights(target, index, folder)
    for name, tensor in target.state_dict().items():
        expect_true(torch.equal(tensor, state[name]), f"{name} restored bit-exactly")
    expect_equal([name for name, param in target.named_parameters() if hasattr(param, "SCB")], [],
                 "parameters given 8-bit statistics (SCB) by an index without SCB entries")
    scb = torch.linspace(1.0, 2.0, 8)
    offload.offload_state_dict(os.path.join(world.shared_dir, "scb"), {**state, "blocks.0.a.SCB": scb})
    with open(os.path.join(world.shared_dir, "scb", "index.json"), encoding="utf-8") as stream:
        with_scb = json.load(stream)
    quantised = built(seed=1, width=8, depth=1)
    modeling.load_offloaded_weights(quantised, with_scb, os.path.join(world.shared_dir, "scb"))
    expect_true(torch.equal(getattr(quantised.blocks[0].a.weight, "SCB", torch.empty(0)), scb),
                "a weight's SCB entry becomes its 8-bit statistics (weight.SCB)")
    expect_equal([name for name, param in quantised.named_parameters() if hasattr(param, "SCB")], ["blocks.0.a.weight"],
                 "only the weight with an SCB entry gets statistics")
    odd = {"half": torch.randn(3, 2).to(torch.bfloat16), "scalar": torch.tensor(7.25)}
    offload.offload_state_dict(os.path.join(world.shared_dir, "odd"), odd)
    loader = offload.OffloadedWeightsLoader(save_folder=os.path.join(world.shared_dir, "odd"))
    expect_equal(sorted(loader), ["half", "scalar"], "OffloadedWeightsLoader lists the index")
    expect_true(loader["half"].dtype == torch.bfloat16 and torch.equal(loader["half"], odd["half"]), "bfloat16 round trip")
    expect_equal(tuple(loader["scalar"].shape), (), "a 0-d tensor stays 0-d")
    expect_equal(loader["scalar"].item(), 7.25, "a 0-d tensor's value")
