"""Probes of ``accelerate.utils.modeling``: sizes, budgets, device maps, ties, moving weights, loading checkpoints.

Budgets keyed by accelerator index run on the CPU too (HF warns that the
device is not available and plans anyway); the CUDA family (the mock GPUs,
two per rank) covers what HF asks ``torch.cuda`` for: free memory, moving a
weight to ``cuda:1``, loading straight to a GPU, the grad scaler.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import logging
import os
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..probe import Api, probe
from ._models import TWO_GPUS, Block, Net, PreTrainedModel, Tied, placement, quiet

M = "utils.modeling."
#: Two mock GPUs of 4 MB each on every rank of the CUDA family.


@probe("utils.modeling")
def file_sizes_and_dtypes(api: Api) -> None:
    for size in (1024, "1GiB", "5MiB", "3KiB", "5GB", "5MB", "10KB", "5Gb", "8Mb", "16kb", "1.5GB", "1e3MB",
                 " 2MB", "5mib", True, "5TB", "12 parsecs", "xMB", "-5MB", -3, 2.5, "", None):
        api.call(f"convert_file_size_to_int {size!r}", M + "convert_file_size_to_int", size)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool,
                  torch.complex64, torch.float8_e4m3fn, "float32", "abc"):
        api.call(f"dtype_byte_size {dtype}", M + "dtype_byte_size", dtype)
    custom = api.get("utils.CustomDtype")
    for dtype in (custom.INT2, custom.INT4, custom.FP8):
        api.call(f"dtype_byte_size {dtype}", M + "dtype_byte_size", dtype)
    same = M + "check_device_same"
    api.call("check_device_same cpu cpu", same, torch.device("cpu"), torch.device("cpu"))
    api.call("check_device_same cuda cuda:0", same, torch.device("cuda"), torch.device("cuda:0"))
    api.call("check_device_same cuda:1 cuda", same, torch.device("cuda:1"), torch.device("cuda"))
    api.call("check_device_same cpu meta", same, torch.device("cpu"), torch.device("meta"))


@probe("utils.modeling")
def tensor_storage_ids(api: Api) -> None:
    ident = api.get(M + "id_tensor_storage")
    base = torch.arange(6.0)
    other = torch.arange(6.0)
    api.observe("a view shares its base's id", lambda: ident(base[2:]) == ident(base))
    api.observe("another tensor has another id", lambda: ident(other) == ident(base))
    api.observe("device and bytes", lambda: (ident(base)[0], ident(base)[2]))
    api.call("a meta tensor", M + "id_tensor_storage", torch.empty(3, 2, device="meta"))
    api.call("not a tensor", M + "id_tensor_storage", [1.0])


@probe("utils.modeling")
def module_tensors_and_buffers(api: Api) -> None:
    model = Net()
    model.blocks[0].register_buffer("mask", torch.ones(1), persistent=False)
    names = api.get(M + "named_module_tensors")
    for kwargs in ({}, {"recurse": True}, {"include_buffers": False, "recurse": True},
                   {"recurse": True, "remove_non_persistent": True}, {"remove_non_persistent": True}):
        api.observe(f"named_module_tensors {kwargs}", lambda kw=kwargs: [n for n, _ in names(model, **kw)])
    for kwargs in ({}, {"recurse": True}, {"recurse": True, "fqns": True}):
        api.call(f"get_non_persistent_buffers {kwargs}", M + "get_non_persistent_buffers", model, **kwargs)
    api.call("get_non_persistent_buffers of a submodule", M + "get_non_persistent_buffers", model.blocks[0])


@probe("utils.modeling")
def module_sizes(api: Api) -> None:
    model = Net()
    sizes = api.call("compute_module_sizes", M + "compute_module_sizes", model)
    api.call("compute_module_sizes float16", M + "compute_module_sizes", model, dtype="float16")
    api.call("compute_module_sizes torch.float64", M + "compute_module_sizes", model, dtype="torch.float64")
    api.call("compute_module_sizes int8", M + "compute_module_sizes", model, dtype=torch.int8)
    api.call("compute_module_sizes special dtypes", M + "compute_module_sizes", model, dtype=torch.float16,
             special_dtypes={"head.weight": "float32", "embed.bias": torch.int8})
    api.call("compute_module_sizes buffers only", M + "compute_module_sizes", model, buffers_only=True)
    api.call("compute_module_sizes unknown dtype", M + "compute_module_sizes", model, dtype="float99")
    complex_model = nn.Linear(2, 2).to(torch.complex64)
    api.call("compute_module_sizes complex with a dtype", M + "compute_module_sizes", complex_model, dtype=torch.float16)
    api.call("compute_module_total_buffer_size", M + "compute_module_total_buffer_size", model)
    api.call("compute_module_total_buffer_size float16", M + "compute_module_total_buffer_size", model, dtype="float16")
    api.call("compute_module_total_buffer_size without buffers", M + "compute_module_total_buffer_size", nn.Linear(2, 2))
    entries = list(model.named_children())
    if sizes is not None:
        layer = M + "get_max_layer_size"
        api.call("get_max_layer_size", layer, entries, sizes, [])
        api.call("get_max_layer_size no split Block", layer, entries, sizes, ["Block"])
        api.call("get_max_layer_size with a tensor entry", layer, [("scale", model.scale)] + entries, sizes, ["Block"])
        api.call("get_max_layer_size of nothing", layer, [], sizes, [])
        api.call("get_max_layer_size unknown name", layer, [("nowhere", nn.Linear(1, 1))], sizes, [])
        api.call("get_module_leaves", M + "get_module_leaves", sizes)
    api.call("get_module_leaves of a flat dict", M + "get_module_leaves", {"": 8, "a": 4, "b": 4, "a.x": 4})
    api.call("calculate_maximum_sizes", M + "calculate_maximum_sizes", model)
    model._no_split_modules = ["Block"]
    api.call("calculate_maximum_sizes with _no_split_modules", M + "calculate_maximum_sizes", model)


@probe("utils.modeling")
def max_memory(api: Api) -> None:
    get = M + "get_max_memory"
    budget = {"cpu": "1KB", 1: "2KiB", "disk": 10**6, 0: 100}
    api.call("strings converted, accelerators first", get, budget)
    api.record("the budget passed in, after the call", budget)
    api.call("only cpu", get, {"cpu": 5000})
    api.call("mps", get, {"mps": "1MB", "cpu": 10})
    api.call("a negative index", get, {-1: 10, "cpu": 10})
    api.call("an unknown key", get, {"gpu": 10, "cpu": 10})
    api.call("a device string key", get, {"cuda:0": 10})
    api.call("an unreadable size", get, {"cpu": "12 parsecs"})
    api.call("empty", get, {})
    api.observe("nothing given: the keys", lambda: sorted(map(str, api.get(get)())))


@probe("utils.modeling", families=("cuda",), env=TWO_GPUS)
def max_memory_of_gpus(api: Api) -> None:
    get = M + "get_max_memory"
    api.observe("nothing given: GPU budgets and keys",
                lambda: {str(k): (v if isinstance(k, int) else "host") for k, v in api.get(get)().items()})
    api.call("a GPU beyond the count", get, {0: 10, 2: 10, "cpu": 10})
    api.observe("balanced on one GPU, budget not given", lambda: {
        str(k): v for k, v in api.get(M + "get_balanced_memory")(Net(), None).items() if k != "cpu"})


@probe("utils.modeling")
def balanced_memory(api: Api) -> None:
    balanced = M + "get_balanced_memory"
    model = Net()
    api.call("two accelerators", balanced, model, {0: 400, 1: 400, "cpu": 1000})
    api.call("three accelerators, no split Block", balanced, model, {0: 300, 1: 300, 2: 300, "cpu": 1000},
             no_split_module_classes=["Block"])
    api.call("no split as a string", balanced, model, {0: 300, 1: 300, "cpu": 1000}, no_split_module_classes="Block")
    api.call("low zero", balanced, model, {0: 300, 1: 300, 2: 300, "cpu": 1000}, low_zero=True)
    api.call("one accelerator, budget given", balanced, model, {0: 300, "cpu": 1000}, low_zero=True)
    api.call("float16", balanced, model, {0: 300, 1: 300, "cpu": 1000}, dtype=torch.float16,
             special_dtypes={"head.weight": torch.float32})
    api.call("a zero budget", balanced, model, {0: 0, 1: 300, 2: 300, "cpu": 10})
    api.call("no accelerator", balanced, model, {"cpu": "1MB"})
    lazy = Net()
    lazy.blocks[0] = nn.Sequential(nn.ReLU(), Block())
    api.call("a no-split class first seen without weights", balanced, lazy, {0: 300, 1: 300, "cpu": 10},
             no_split_module_classes=["Block", "ReLU"])


@probe("utils.modeling")
def device_maps(api: Api) -> None:
    infer = M + "infer_auto_device_map"
    model = Net()
    api.call("everything on the cpu", infer, model, {"cpu": 10000})
    api.call("two accelerators and cpu", infer, model, {0: 200, 1: 200, "cpu": 300})
    api.call("no split Block, verbose", infer, model, {0: 200, 1: 200, "cpu": 300},
             no_split_module_classes=["Block"], verbose=True)
    api.call("spills to disk", infer, model, {0: 150, "cpu": 150}, no_split_module_classes="Block")
    api.call("not cleaned", infer, model, {0: 250, "cpu": 10000}, clean_result=False)
    api.call("float16", infer, model, {0: 200, "cpu": 10000}, dtype="float16",
             special_dtypes={"head.weight": torch.float32})
    api.call("offload buffers", infer, model, {0: 150, "cpu": 200}, offload_buffers=True)
    api.call("fallback allocation", infer, model, {0: 100, 1: 400, "cpu": 10000}, no_split_module_classes=["Block"],
             fallback_allocation=True)
    api.call("without fallback allocation", infer, model, {0: 100, 1: 400, "cpu": 10000},
             no_split_module_classes=["Block"])
    buffered = Net()
    buffered.blocks[0].norm.register_buffer("big", torch.zeros(100))
    api.call("offloaded buffers fit no accelerator", infer, buffered, {0: 200, "cpu": 200})
    holder = nn.Sequential(nn.Linear(3, 4), Net())
    holder[1].register_buffer("steps", torch.zeros(20))
    api.call("a split module with its own buffer", infer, holder, {0: 400, "cpu": 10000})
    api.call("an unknown device", infer, model, {"gpu": 10})
    with api.logs_at(logging.INFO, "utils.modeling"):  # the minimum-memory report is INFO
        api.call("a zero budget", infer, model, {0: 0, "cpu": 10000})
        api.call("a device left for the next, the minimum needed logged", infer, model, {0: 100, 1: 400, "cpu": 10000},
                 no_split_module_classes=["Block"])
    api.call("a meta model", infer, _on_meta(), {0: 200, "cpu": 10000})


def _on_meta() -> nn.Module:
    with torch.device("meta"):
        return Net()


def _tied_to_a_child(after_a_leaf: bool = False) -> nn.Module:
    """A leaf Linear whose weight is tied to a Linear inside the next module: when both do not fit, the twin (which
    has children) is split. ``after_a_leaf`` puts a plain Linear first, so the device is no longer empty then."""
    torch.manual_seed(0)
    first = [("pre", nn.Linear(8, 8))] if after_a_leaf else []
    model = nn.Sequential(OrderedDict([*first, ("lead", nn.Linear(8, 8)),
                                       ("deep", nn.Sequential(OrderedDict(a=nn.Linear(8, 8), b=nn.Linear(8, 8)))),
                                       ("tail", nn.Linear(8, 8))]))
    model.deep.a.weight = model.lead.weight
    return model


@probe("utils.modeling")
def device_maps_with_ties(api: Api) -> None:
    infer = M + "infer_auto_device_map"
    tied = Tied()
    api.call("tied everything fits", infer, tied, {0: 1000, "cpu": 1000})
    api.call("tied split across", infer, tied, {0: 120, 1: 200, "cpu": 1000})
    api.call("tied verbose", infer, tied, {0: 120, 1: 120, "cpu": 1000}, verbose=True)
    api.call("tied with fallback", infer, tied, {0: 90, 1: 1000, "cpu": 1000}, fallback_allocation=True)
    api.call("transformers-like untied", infer, PreTrainedModel(), {"cpu": 1000})
    api.call("a tied twin split to fit, verbose", infer, _tied_to_a_child(), {"cpu": 700}, verbose=True)
    api.call("a tied twin split to fit after a leaf, verbose", infer, _tied_to_a_child(after_a_leaf=True),
             {"cpu": 1000}, verbose=True)
    api.observe("find_tied_parameters", lambda: sorted(api.get(M + "find_tied_parameters")(tied)))
    api.call("find_tied_parameters none", M + "find_tied_parameters", Net())
    three = Tied()
    three.body[0].weight = three.body[1].weight
    api.observe("find_tied_parameters two groups", lambda: sorted(api.get(M + "find_tied_parameters")(three)))
    api.call("check_tied_parameters_in_config nn.Module", M + "check_tied_parameters_in_config", tied)
    api.call("check_tied_parameters_in_config PreTrainedModel", M + "check_tied_parameters_in_config", PreTrainedModel())
    groups = [["embed.weight", "head.weight"]]
    same = M + "check_tied_parameters_on_same_device"
    api.call("tied on one device", same, groups, {"": "cpu"})
    api.call("tied on two devices", same, groups, {"embed": 0, "body": "cpu", "head": "cpu"})
    api.call("tied by a parent key", same, groups, {"embed.weight": 0, "head": 1})
    api.call("tied name not in the map", same, groups, {"body": 0, "head": 0})
    ties = M + "get_module_size_with_ties"
    entries = list(tied.named_children())
    sizes = api.get(M + "compute_module_sizes")(tied)
    api.call("get_module_size_with_ties", ties, ["head.weight"], sizes["embed"], sizes, entries)
    api.call("get_module_size_with_ties none", ties, [], 40, sizes, entries)
    api.call("get_module_size_with_ties lost twin", ties, ["head.weight"], 40, sizes, entries[:1])


@probe("utils.modeling")
def fallback_allocation(api: Api) -> None:
    model = Net()
    sizes = api.get(M + "compute_module_sizes")(model)
    allocate = M + "fallback_allocate"
    names = lambda found: None if found is None else [found[0], [n for n, _ in found[2]]]  # noqa: E731
    for limit in (50, 100, "100", "1KB", 1, "a lot"):
        modules = list(model.named_children())
        api.observe(f"limit {limit!r}", lambda m=modules, lim=limit: names(api.get(allocate)(m, sizes, lim)))
        api.record(f"limit {limit!r}: the list passed in, after", [n for n, _ in modules])
    modules = list(model.named_children())
    api.observe("no split Block", lambda: names(api.get(allocate)(modules, sizes, 160, ["Block"])))
    tied = Tied()
    tied_sizes = api.get(M + "compute_module_sizes")(tied)
    groups = api.get(M + "find_tied_parameters")(tied)
    api.observe("tied", lambda: names(api.get(allocate)(list(tied.named_children()), tied_sizes, 120, None, groups)))


@probe("utils.modeling")
def clean_and_check_device_maps(api: Api) -> None:
    clean = M + "clean_device_map"
    api.call("clean merges siblings", clean, {"a.x": 0, "a.y": 0, "b": 1, "c.p.q": "cpu", "c.p.r": "cpu", "c.s": 0})
    api.call("clean a module name", clean, {"a.x": 0, "a.y": 0, "b": 1}, "a")
    api.call("clean one device", clean, OrderedDict([("a", "cpu"), ("b", "cpu")]))
    api.call("clean empty", clean, {})
    check = M + "check_device_map"
    model = Net()
    api.call("covers everything", check, model, {"": "cpu"})
    api.call("covers by modules", check, model, {"embed": 0, "blocks": 0, "head": "cpu", "scale": "cpu"})
    api.call("a weight left out", check, model, {"embed": 0, "blocks.0": 0, "head": "cpu"})
    api.call("an unknown key", check, model, {"": "cpu", "nowhere": 0})
    api.call("a parameter as a key", check, model, {"embed.weight": 0, "embed.bias": 0, "blocks": 0, "head": 0,
                                                     "scale": 0})
    api.call("an unknown key and a weight left out", check, model, {"embed": 0, "trunk": 0})


@probe("utils.modeling")
def tied_parameters_retied(api: Api) -> None:
    retie = M + "retie_parameters"
    model = Tied()
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    api.call("retie", retie, model, [["embed.weight", "head.weight"]])
    api.record("tied again", model.head.weight is model.embed.weight)
    meta_first = Tied()
    meta_first.embed.weight = nn.Parameter(torch.empty(5, 4, device="meta"))
    api.call("retie to the weight not on meta", retie, meta_first, [["embed.weight", "head.weight"]])
    api.record("meta first: tied to the real one", [meta_first.embed.weight is meta_first.head.weight,
                                                    str(meta_first.embed.weight.device)])
    all_meta = Tied()
    all_meta.embed.weight = nn.Parameter(torch.empty(5, 4, device="meta"))
    all_meta.head.weight = nn.Parameter(torch.empty(5, 4, device="meta"))
    api.call("retie all on meta", retie, all_meta, [["embed.weight", "head.weight"]])
    api.record("all meta: tied", all_meta.embed.weight is all_meta.head.weight)
    api.call("retie an unknown name", retie, Tied(), [["embed.weight", "nowhere.weight"]])
    api.call("retie nothing", retie, Tied(), [])


@probe("utils.modeling")
def tensor_to_device(api: Api) -> None:
    move = M + "set_module_tensor_to_device"
    model = Net()
    model.head.weight.requires_grad_(False)
    api.call("to cpu", move, model, "embed.weight", "cpu")
    api.call("a value", move, model, "embed.bias", "cpu", value=torch.arange(4.0))
    api.call("a value cast to the old dtype", move, model, "head.bias", "cpu", value=torch.tensor([1, 2]))
    api.call("a value with a dtype", move, model, "blocks.0.linear.bias", "cpu", value=torch.ones(4), dtype="float16")
    api.call("an int value with a dtype", move, model, "blocks.0.norm.num_batches_tracked", "cpu",
             value=torch.tensor(7), dtype=torch.float16)
    api.call("a buffer", move, model, "scale", "cpu", value=torch.tensor([3.0, 4.0]))
    api.call("a frozen weight", move, model, "head.weight", "cpu", value=torch.ones(2, 4))
    api.call("to meta", move, model, "blocks.1.linear.weight", "meta")
    api.call("to meta with a dtype", move, model, "blocks.1.linear.bias", "meta", dtype=torch.float16)
    api.call("to meta with a dtype, an int buffer", move, model, "blocks.1.norm.num_batches_tracked", "meta",
             dtype=torch.float16)
    api.call("from meta without a value", move, model, "blocks.1.linear.weight", "cpu")
    api.call("from meta with a value", move, model, "blocks.1.linear.weight", "cpu", value=torch.ones(4, 4))
    api.call("a wrong shape", move, model, "embed.weight", "cpu", value=torch.ones(3, 4))
    api.call("an unknown tensor", move, model, "embed.gain", "cpu")
    api.call("an unknown module", move, model, "trunk.weight", "cpu")
    holder = Net()
    holder.extra = None
    api.call("through a None attribute", move, holder, "extra.weight", "cpu")
    api.call("xpu unavailable", move, model, "embed.weight", "xpu:0")
    api.call("a list value", move, model, "scale", "cpu", value=[1.0, 2.0])
    indexed = nn.Linear(2, 2)
    api.call("a value to an indexed cpu device", move, indexed, "weight", torch.device("cpu", 0), value=torch.ones(2, 2))
    api.record("a value to an indexed cpu device: what the module holds", type(indexed._parameters["weight"]).__name__)
    api.record("placement", placement(model))
    api.record("values", {n: t for n, t in model.state_dict().items() if not t.is_meta})
    tied = Tied()
    tied_map = {tied.embed.weight.data_ptr(): {}}
    api.call("tied map: first copy", move, tied, "embed.weight", "meta", tied_params_map=tied_map)
    api.observe("tied map: devices recorded", lambda: [str(d) for d in tied_map[next(iter(tied_map))]])
    value = torch.ones(5, 4)
    value_map = {value.data_ptr(): {}}
    api.call("tied map: a value", move, tied, "embed.weight", "cpu", value=value, tied_params_map=value_map)
    api.call("tied map: its twin reuses it", move, tied, "head.weight", "cpu", value=value, tied_params_map=value_map)
    api.record("tied map: one tensor", tied.embed.weight is tied.head.weight)


@probe("utils.modeling", families=("cuda",), env=TWO_GPUS)
def tensor_to_gpus(api: Api) -> None:
    move = M + "set_module_tensor_to_device"
    model = Net()
    api.call("to 0", move, model, "embed.weight", 0)
    api.call("to cuda:1", move, model, "embed.bias", "cuda:1")
    api.call("to a torch device", move, model, "head.weight", torch.device("cuda", 1), value=torch.ones(2, 4))
    api.call("a buffer to 1", move, model, "scale", 1)
    api.call("back to cpu", move, model, "embed.weight", "cpu")
    api.call("to a GPU beyond the count", move, model, "head.bias", "cuda:5")
    api.record("placement", placement(model))
    with api.get("init_empty_weights")():
        empty = Net()
    state = Net().state_dict()
    api.call("load_state_dict-free load to the GPU", M + "load_offloaded_weights", empty, {}, str(api.tmp))
    for name, tensor in state.items():
        api.get(move)(empty, name, 1, value=tensor)
    api.record("filled on GPU 1", placement(empty))


@probe("utils.modeling")
def offloaded_weights_loaded(api: Api) -> None:
    folder = str(api.tmp / "offload")
    state = Net().state_dict()
    state["head.weight"] = state["head.weight"].half()
    api.get("utils.offload_state_dict")(folder, state)
    with open(os.path.join(folder, "index.json")) as stream:
        index = json.load(stream)
    with api.get("init_empty_weights")():
        model = Net()
    api.call("load", M + "load_offloaded_weights", model, index, folder)
    api.record("placement", placement(model))
    api.record("values", model.state_dict())
    api.call("an empty index", M + "load_offloaded_weights", model, {}, folder)
    api.call("no index", M + "load_offloaded_weights", model, None, folder)
    api.call("a missing file", M + "load_offloaded_weights", Net(), {"embed.gain": index["embed.bias"]}, folder)


def _save_checkpoints(folder: str, state: dict) -> dict[str, str]:
    """Every layout load_checkpoint_in_model reads, under ``folder``; their paths by name."""
    paths = {}
    os.makedirs(os.path.join(folder, "bin"))
    paths["bin"] = os.path.join(folder, "bin", "pytorch_model.bin")
    torch.save(state, paths["bin"])
    os.makedirs(os.path.join(folder, "safe"))
    paths["safe"] = os.path.join(folder, "safe", "model.safetensors")
    save_file({k: v.contiguous() for k, v in state.items()}, paths["safe"], metadata={"format": "pt"})
    os.makedirs(os.path.join(folder, "sharded"))
    names = list(state)
    halves = {"part-1.bin": names[: len(names) // 2], "part-2.bin": names[len(names) // 2:]}
    for file, keys in halves.items():
        torch.save({k: state[k] for k in keys}, os.path.join(folder, "sharded", file))
    paths["index"] = os.path.join(folder, "sharded", "pytorch_model.bin.index.json")
    with open(paths["index"], "w") as stream:
        json.dump({"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}, stream)
    paths["sharded"] = os.path.join(folder, "sharded")
    return paths


@probe("utils.modeling")
def checkpoints_loaded(api: Api) -> None:
    source = Net()
    paths = _save_checkpoints(str(api.tmp / "ckpt"), source.state_dict())
    load = M + "load_checkpoint_in_model"
    for layout in ("bin", "safe", "index", "sharded"):
        model = Net()
        api.call(f"{layout}: load", load, model, paths[layout])
        api.record(f"{layout}: values", model.state_dict())
    api.call("the bin folder", load, Net(), os.path.dirname(paths["bin"]))
    api.call("a path object naming a file", load, Net(), Path(paths["bin"]))
    api.call("a path object naming a folder", load, Net(), Path(paths["sharded"]))
    empty = api.tmp / "empty"
    empty.mkdir()
    api.call("a folder with no weights", load, Net(), str(empty))
    two = api.tmp / "two"
    two.mkdir()
    (two / "a.index.json").write_text("{}")
    (two / "b.index.json").write_text("{}")
    api.call("a folder with two indexes", load, Net(), str(two))
    api.call("a path that does not exist", load, Net(), str(api.tmp / "nowhere.bin"))
    model = Net()
    api.call("dtype float16 with fp32 modules", load, model, paths["bin"], device_map={"": "cpu"}, dtype="float16",
             keep_in_fp32_modules=["head"])
    api.record("dtype: placement", placement(model))
    model = Net()
    api.call("dtype float16 without a map", load, model, paths["bin"], dtype=torch.float16)
    api.record("dtype without a map: placement", placement(model))


@probe("utils.modeling")
def checkpoints_loaded_with_device_maps(api: Api) -> None:
    source = Net()
    paths = _save_checkpoints(str(api.tmp / "ckpt"), source.state_dict())
    load = M + "load_checkpoint_in_model"
    disk_map = {"embed": "cpu", "blocks.0": "disk", "blocks.1": "cpu", "head": "disk", "scale": "cpu"}
    api.call("disk without a folder", load, Net(), paths["bin"], device_map=disk_map)
    with api.get("init_empty_weights")():
        model = Net()
    api.observe("disk with a folder", quiet, api.get(load), model, paths["safe"], device_map=disk_map,
                offload_folder=str(api.tmp / "off"))
    api.record("disk: placement", placement(model))
    with api.get("init_empty_weights")():
        model = Net()
    api.call("disk with buffers, staged state dict", load, model, paths["index"], device_map=disk_map,
             offload_folder=str(api.tmp / "off_buffers"), offload_buffers=True, offload_state_dict=True)
    api.record("disk with buffers: placement", placement(model))
    api.call("a weight without a device", load, Net(), paths["bin"], device_map={"embed": "cpu", "blocks": "cpu"})
    api.call("a map key the model lacks", load, Net(), paths["bin"], device_map={"": "cpu", "trunk": "cpu"})


@probe("utils.modeling")
def checkpoints_with_mismatched_keys(api: Api) -> None:
    state = Net().state_dict()
    extra = dict(state, **{"extra.weight": torch.ones(2)})
    folder = api.tmp / "mismatch"
    folder.mkdir()
    torch.save(extra, folder / "extra.bin")
    missing = {k: v for k, v in state.items() if k != "head.bias"}
    torch.save(missing, folder / "missing.bin")
    load = M + "load_checkpoint_in_model"
    api.call("an unexpected key", load, Net(), str(folder / "extra.bin"))
    api.call("an unexpected key, with a map", load, Net(), str(folder / "extra.bin"), device_map={"": "cpu"})
    api.call("an unexpected key, strict", load, Net(), str(folder / "extra.bin"), strict=True)
    api.call("a missing key", load, Net(), str(folder / "missing.bin"))
    api.call("a missing key, with a map", load, Net(), str(folder / "missing.bin"), device_map={"": "cpu"})
    api.call("a missing key, strict", load, Net(), str(folder / "missing.bin"), strict=True)
    wrong = dict(state, **{"head.bias": torch.ones(3)})
    torch.save(wrong, folder / "wrong.bin")
    api.call("a wrong shape", load, Net(), str(folder / "wrong.bin"))
    api.call("a wrong shape, with a map", load, Net(), str(folder / "wrong.bin"), device_map={"": "cpu"})
    tied = Tied()
    torch.save(Tied().state_dict(), folder / "tied.bin")
    api.call("tied", load, tied, str(folder / "tied.bin"), device_map={"embed": "cpu", "body": "cpu", "head": "disk"},
             offload_folder=str(api.tmp / "tied_off"))
    api.record("tied: still tied", tied.embed.weight is tied.head.weight)
    api.call("transformers-like untied", load, PreTrainedModel(), _saved(folder, PreTrainedModel()))


def _saved(folder, model: nn.Module) -> str:
    path = str(folder / f"{type(model).__name__}.bin")
    torch.save(model.state_dict(), path)
    return path


@probe("utils.modeling")
def state_dicts_loaded(api: Api) -> None:
    state = Net().state_dict()
    folder = api.tmp / "files"
    folder.mkdir()
    read = M + "load_state_dict"
    torch.save(state, folder / "w.bin")
    api.call("a torch file", read, str(folder / "w.bin"))
    contiguous = {k: v.contiguous() for k, v in state.items()}
    save_file(contiguous, str(folder / "plain.safetensors"))
    api.call("safetensors without metadata", read, str(folder / "plain.safetensors"))
    for fmt in ("pt", "tf", "flax", "jax"):
        save_file(contiguous, str(folder / f"{fmt}.safetensors"), metadata={"format": fmt})
        api.call(f"safetensors format {fmt}", read, str(folder / f"{fmt}.safetensors"))
    api.call("safetensors to one device", read, str(folder / "pt.safetensors"), device_map={"": "cpu"})
    api.call("safetensors to one device, meta", read, str(folder / "pt.safetensors"), device_map={"": "meta"})
    api.call("safetensors to one device given as a torch.device", read, str(folder / "pt.safetensors"),
             device_map={"": torch.device("cpu")})
    api.observe("safetensors to several devices", quiet, api.get(read), str(folder / "pt.safetensors"),
                device_map={"embed": "cpu", "blocks": "disk", "head": "meta"})
    api.call("a missing torch file", read, str(folder / "none.bin"))
    api.call("a missing safetensors file", read, str(folder / "none.safetensors"))
    api.call("a path object", read, folder / "w.bin")
    (folder / "bad.bin").write_bytes(b"not a pickle")
    api.call("not a checkpoint", read, str(folder / "bad.bin"))


@probe("utils.modeling", families=("cuda",), env=TWO_GPUS)
def state_dicts_loaded_to_gpus(api: Api) -> None:
    state = Net().state_dict()
    path = str(api.tmp / "w.safetensors")
    save_file({k: v.contiguous() for k, v in state.items()}, path, metadata={"format": "pt"})
    read = M + "load_state_dict"
    api.call("to GPU 1", read, path, device_map={"": 1})
    api.call("to GPU 1 given as a torch.device", read, path, device_map={"": torch.device("cuda", 1)})
    api.call("to GPU 1 given as a string", read, path, device_map={"": "cuda:1"})
    api.observe("to both GPUs", quiet, api.get(read), path, device_map={"embed": 0, "blocks": 1, "head": "cpu"})
    bin_path = str(api.tmp / "w.bin")
    torch.save(state, bin_path)
    model = Net()
    api.call("load_checkpoint_in_model to the GPUs", M + "load_checkpoint_in_model", model, bin_path,
             device_map={"embed": 0, "blocks": 1, "head": "cpu", "scale": 0})
    api.record("placement", placement(model))


@probe("utils.modeling")
def offloaded_modules(api: Api) -> None:
    has = M + "has_offloaded_params"
    model = Net()
    api.call("has_offloaded_params before", has, model.embed)
    api.get("cpu_offload")(model, execution_device="cpu")
    api.call("has_offloaded_params after", has, model.embed)
    api.call("has_offloaded_params of the model", has, model)
    align = api.get(M + "align_module_device")

    def inside(module, device=None):
        with align(module, device):
            return placement(module)

    api.observe("align an offloaded module", inside, model.embed)
    api.observe("align an offloaded module to meta", inside, model.blocks[0].linear, "meta")
    api.record("offloaded after align", placement(model))
    plain = nn.Linear(2, 2)
    api.observe("align a plain module to meta", inside, plain, "meta")
    api.record("plain after align", placement(plain))
    api.observe("align a plain module to nothing", inside, nn.Linear(2, 2))
    api.call("get_state_dict_offloaded_model", M + "get_state_dict_offloaded_model", model)
    partly = Net()
    partly.head.weight = nn.Parameter(torch.empty(2, 4, device="meta"))
    api.call("a weight left on meta", M + "get_state_dict_offloaded_model", partly)
    target = {"embed.weight": "x", "embed.bias": "y", "head.weight": "z"}
    api.call("get_state_dict_from_offload", M + "get_state_dict_from_offload", model.embed, "embed.weight", target)
    api.call("get_state_dict_from_offload not offloaded", M + "get_state_dict_from_offload", nn.Linear(4, 2),
             "head.weight", {"head.weight": "x"}, "meta")


@probe("utils.modeling", families=("cpu", "cuda"))
def precision_helpers(api: Api) -> None:
    api.call("get_grad_scaler", M + "get_grad_scaler")
    scaler = api.get(M + "get_grad_scaler")(init_scale=1024.0)
    api.observe("scaler enabled and scale", lambda: [scaler.is_enabled(), scaler._init_scale])
    fsdp = api.get("utils.DistributedType").FSDP
    api.call("FSDP", M + "get_grad_scaler", fsdp)
    api.accelerator(mixed_precision="bf16")
    api.observe("no native amp", lambda: type(api.get(M + "get_mixed_precision_context_manager")()).__name__)
    context = api.get(M + "get_mixed_precision_context_manager")(native_amp=True)
    api.observe("bf16 autocast", lambda: [type(context).__name__, context.device, context.fast_dtype])
    kwargs = api.get("utils.AutocastKwargs")(cache_enabled=False)
    context = api.get(M + "get_mixed_precision_context_manager")(True, kwargs)
    api.observe("autocast kwargs", lambda: [context.fast_dtype, context._cache_enabled])
    if importlib.util.find_spec("peft") is not None:
        _imported_quietly("peft")
    api.call("is_peft_model", M + "is_peft_model", Net())


def _imported_quietly(name: str) -> None:
    """Import ``name`` with its warnings and stderr dropped: peft's import warns (torch.jit deprecations) and prints
    (bitsandbytes' CPU kernels) once a process, and ``is_peft_model`` imports it on either side, so which side says
    so depends only on whether an earlier probe in the process imported it first."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        importlib.import_module(name)


@probe("utils.modeling", env={"ACCELERATE_MIXED_PRECISION": "fp16"})
def precision_from_the_environment(api: Api) -> None:
    """The autocast of a mixed precision read from the environment (a string built at run time, not a literal)."""
    accelerator = api.accelerator()
    api.record("mixed precision", accelerator.mixed_precision)
    context = api.get(M + "get_mixed_precision_context_manager")(native_amp=True)
    api.observe("fp16 autocast", lambda: [type(context).__name__, context.device, context.fast_dtype])
