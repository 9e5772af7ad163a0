"""Probes of ``accelerate.utils.other``: unwrapping prepared models, regional compilation, saving and loading,
and the small helpers (names, dicts, ports, sizes, the kernel check, attribute paths, module order)."""

from __future__ import annotations

import io
import platform
import socket
from collections import OrderedDict
from functools import partial
from types import SimpleNamespace

import numpy as np
import torch

from ..probe import Api, probe

AREA = "utils.other"


def _path(name: str) -> str:
    return f"{AREA}.{name}"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class Tower(torch.nn.Module):
    """Repeated blocks under a ModuleList, and a head that is not repeated."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Wrapper(torch.nn.Module):
    """A sublayer wrapper that keeps what it wraps under ``.module`` (as FSDP on XLA does)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def _shape(module: object) -> object:
    """What a module tree is: class names by path, and which parts are compiled (wrapped or in place)."""
    if not isinstance(module, torch.nn.Module):
        return module
    return {name or "<root>": [type(sub).__name__, getattr(sub, "_compiled_call_impl", None) is not None]
            for name, sub in module.named_modules()}


@probe(AREA)
def compiled_and_repeated_modules(api: Api) -> None:
    tower, leaf = Tower(), torch.nn.Linear(2, 2)
    compiled_leaf = torch.compile(leaf, backend="eager")
    tower_with_compiled_child = Tower()
    tower_with_compiled_child.head = torch.compile(tower_with_compiled_child.head, backend="eager")
    cases = {"a tower": tower, "a leaf": leaf, "a compiled leaf": compiled_leaf,
             "a tower with a compiled child": tower_with_compiled_child, "a ModuleList": tower.blocks,
             "an empty ModuleList": torch.nn.ModuleList(),
             "a mixed ModuleList": torch.nn.ModuleList([Block(), torch.nn.Linear(2, 2)]),
             "a ModuleList of subclasses": torch.nn.ModuleList([torch.nn.Module(), Block()])}
    for name in ("is_compiled_module", "has_compiled_regions", "is_repeated_blocks", "has_repeated_blocks"):
        for label, module in cases.items():
            api.call(f"{name}: {label}", _path(name), module)


@probe(AREA)
def compile_regions(api: Api) -> None:
    for label, module in {"a tower": Tower(), "a leaf": torch.nn.Linear(2, 2),
                          "a ModuleList": torch.nn.ModuleList([Block(), Block()]),
                          "a sequential of towers": torch.nn.Sequential(Tower(), torch.nn.ReLU())}.items():
        compiled = api.call(f"compile_regions: {label}", _path("compile_regions"), module, backend="eager")
        if compiled is None:
            continue
        api.record(f"{label}: shape", _shape(compiled))
        api.observe(f"{label}: keeps the original", lambda: compiled.__dict__.get("_orig_mod") is module)
        api.observe(f"{label}: the input is untouched", lambda: _shape(module))
        api.call(f"{label}: has_compiled_regions", _path("has_compiled_regions"), compiled)
        api.call(f"{label}: is_compiled_module", _path("is_compiled_module"), compiled)
        api.observe(f"{label}: shares parameters", lambda: all(
            a is b for a, b in zip(compiled.parameters(), module.parameters())))
    tower = Tower()
    tower.forward = tower.forward  # a bound method in the instance's dict is rebound to the copy
    compiled = api.get(_path("compile_regions"))(tower, backend="eager")
    api.observe("a bound forward is rebound", lambda: compiled.__dict__["forward"].__self__ is compiled)


@probe(AREA)
def compile_regions_in_place(api: Api) -> None:
    for name in ("compile_regions_deepspeed", "compile_regions_fsdp2"):
        for label, module in {"a tower": Tower(), "a leaf": torch.nn.Linear(2, 2),
                              "a ModuleList": torch.nn.ModuleList([Block(), Block()])}.items():
            returned = api.call(f"{name}: {label}", _path(name), module, backend="eager")
            api.observe(f"{name}: {label}: returns the module", lambda: returned is module)
            api.record(f"{name}: {label}: shape", _shape(module))


@probe(AREA)
def extract_model_from_parallel(api: Api) -> None:
    extract = _path("extract_model_from_parallel")
    model = Tower()
    api.observe("a plain model", lambda: api.get(extract)(model) is model)
    parallel = torch.nn.DataParallel(model)
    api.observe("DataParallel", lambda: api.get(extract)(parallel) is model)
    api.observe("DataParallel in DataParallel", lambda: api.get(extract)(torch.nn.DataParallel(parallel)) is model)
    compiled = torch.compile(parallel, backend="eager")
    kept = api.call("compiled DataParallel", extract, compiled)
    api.observe("compiled: the wrapper is kept", lambda: kept is compiled and compiled._orig_mod is model)
    unwrapped = api.call("compiled, keep_torch_compile=False", extract, torch.compile(parallel, backend="eager"),
                         keep_torch_compile=False)
    api.observe("compiled, keep_torch_compile=False: the model", lambda: unwrapped is model)
    regional = api.get(_path("compile_regions"))(Tower(), backend="eager")
    original = regional.__dict__["_orig_mod"]
    api.observe("regional, kept", lambda: api.get(extract)(regional) is regional)
    api.observe("regional, keep_torch_compile=False", lambda: api.get(extract)(regional, keep_torch_compile=False)
                is original)
    partly = Tower()
    partly.head = torch.compile(partly.head, backend="eager")
    api.observe("a compiled child without _orig_mod", lambda: api.get(extract)(partly, keep_torch_compile=False)
                is partly)
    nested = Wrapper(torch.nn.Sequential(Wrapper(torch.nn.Linear(2, 2)), Wrapper(Wrapper(torch.nn.ReLU()))))
    api.observe("not recursive", lambda: _shape(api.get(extract)(nested)))
    api.observe("recursive", lambda: _shape(api.get(extract)(nested, recursive=True)))
    holder = SimpleNamespace(module=1)
    api.call("recursive on a non-module", extract, holder, recursive=True)


@probe(AREA)
def extract_model_from_parallel_fp32_wrapper(api: Api) -> None:
    """A model prepared for bf16 has its forward wrapped; ``keep_fp32_wrapper=False`` gives the user's back."""
    accelerator = api.accelerator(mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    x = torch.ones(1, 2)
    api.observe("prepared forward", lambda: model(x).dtype)
    api.observe("has _original_forward", lambda: "_original_forward" in model.__dict__)
    kept = api.call("keep_fp32_wrapper=True", _path("extract_model_from_parallel"), model)
    api.observe("kept forward", lambda: kept(x).dtype)
    unwrapped = api.call("keep_fp32_wrapper=False", _path("extract_model_from_parallel"), model,
                         keep_fp32_wrapper=False)
    api.observe("unwrapped: _original_forward left", lambda: "_original_forward" in unwrapped.__dict__)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        api.observe("unwrapped forward under autocast", lambda: unwrapped(x).dtype)
    api.observe("unwrapped forward", lambda: unwrapped(x).dtype)
    api.observe("unwrapped again", lambda: api.get(_path("extract_model_from_parallel"))(
        unwrapped, keep_fp32_wrapper=False)(x).dtype)


def _ddp_model(api: Api) -> object:
    api.partial_state()
    torch.manual_seed(0)
    return torch.nn.parallel.DistributedDataParallel(Tower())


@probe(AREA, worlds=(2,))
def extract_model_from_ddp(api: Api) -> None:
    ddp = _ddp_model(api)
    api.observe("DDP", lambda: api.get(_path("extract_model_from_parallel"))(ddp) is ddp.module)
    compiled = torch.compile(ddp, backend="eager")
    api.observe("compiled DDP", lambda: api.get(_path("extract_model_from_parallel"))(compiled) is compiled)
    api.observe("compiled DDP unwrapped", lambda: api.get(_path("extract_model_from_parallel"))(
        compiled, keep_torch_compile=False) is ddp.module)


@probe(AREA, worlds=(2,))
def model_has_dtensor(api: Api) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    api.partial_state()
    model = torch.nn.Linear(2, 2)
    api.call("a plain model", _path("model_has_dtensor"), model)
    mesh = init_device_mesh("cpu", (api.world_size,))
    model.weight = torch.nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Replicate()]))
    api.call("a model with a DTensor", _path("model_has_dtensor"), model)


@probe(AREA)
def get_model_tp_size(api: Api) -> None:
    tp_size = _path("get_model_tp_size")
    api.call("a plain model", tp_size, torch.nn.Linear(1, 1))
    api.call("tp_size on the model", tp_size, SimpleNamespace(tp_size=4))
    api.call("tp_size None, a dict config", tp_size,
             SimpleNamespace(tp_size=None, config=SimpleNamespace(distributed_config={"tp_size": 2})))
    api.call("an object config", tp_size, SimpleNamespace(config=SimpleNamespace(
        distributed_config=SimpleNamespace(tp_size=8))))
    api.call("a dict config without tp_size", tp_size, SimpleNamespace(config=SimpleNamespace(distributed_config={})))
    api.call("no distributed config", tp_size, SimpleNamespace(config=SimpleNamespace()))
    api.call("tp_size 0", tp_size, SimpleNamespace(tp_size=0, config=SimpleNamespace(distributed_config={"tp_size": 2})))


@probe(AREA, worlds=(1, 2))
def wait_for_everyone(api: Api) -> None:
    api.partial_state()
    api.call("wait_for_everyone", _path("wait_for_everyone"))


def _tied_state_dict() -> OrderedDict:
    weight = torch.arange(4.0).reshape(2, 2)
    return OrderedDict([("embed.weight", weight), ("head.weight", weight), ("head.bias", torch.zeros(2)),
                        ("transposed", torch.arange(6.0).reshape(2, 3).t()), ("quant_state", "bnb")])


@probe(AREA)
def clean_state_dict_for_safetensors(api: Api) -> None:
    state_dict = _tied_state_dict()
    cleaned = api.call("tied weights", _path("clean_state_dict_for_safetensors"), state_dict)
    api.record("the input afterwards", list(state_dict))
    if cleaned is not None:
        api.observe("contiguous", lambda: {key: value.is_contiguous() for key, value in cleaned.items()
                                           if isinstance(value, torch.Tensor)})
        api.observe("a new dict", lambda: cleaned is state_dict)
    shared = torch.zeros(4)
    views = {"a": shared[:2], "b": shared[2:], "c": shared, "d": torch.ones(1)}
    api.call("views of one storage", _path("clean_state_dict_for_safetensors"), views)
    api.record("views afterwards", list(views))
    api.call("nothing shared", _path("clean_state_dict_for_safetensors"), {"a": torch.ones(1), "b": torch.ones(1)})
    api.call("empty", _path("clean_state_dict_for_safetensors"), {})


@probe(AREA, worlds=(1, 2))
def save(api: Api) -> None:
    api.partial_state()
    save_ = _path("save")
    api.call("pickle", save_, {"step": 3, "weights": torch.arange(3.0)}, str(api.tmp / "plain.bin"))
    api.call("each node", save_, {"rank": 0}, str(api.tmp / "node.bin"), save_on_each_node=True)
    api.call("safetensors, an OrderedDict with tied weights", save_, _tied_state_dict_tensors(),
             str(api.tmp / "tied.safetensors"), safe_serialization=True)
    api.call("safetensors, a dict", save_, {"w": torch.ones(2, 2)}, str(api.tmp / "dict.safetensors"),
             safe_serialization=True)
    tied = dict(_tied_state_dict_tensors())
    api.call("safetensors, a dict with tied weights", save_, tied, str(api.tmp / "tied_dict.safetensors"),
             safe_serialization=True)
    api.call("safetensors, not tensors", save_, {"step": 3}, str(api.tmp / "bad.safetensors"),
             safe_serialization=True)
    api.call("safetensors, a list", save_, [torch.ones(1)], str(api.tmp / "list.safetensors"),
             safe_serialization=True)
    buffer = io.BytesIO()
    api.call("to a file object", save_, {"x": torch.ones(2)}, buffer)
    api.observe("the file object holds it", lambda: bool(buffer.getvalue()) == (api.rank == 0))
    api.call("into a missing folder", save_, {"x": 1}, str(api.tmp / "missing" / "x.bin"))


def _tied_state_dict_tensors() -> OrderedDict:
    state_dict = _tied_state_dict()
    del state_dict["quant_state"]
    return state_dict


@probe(AREA)
def load(api: Api) -> None:
    load_ = _path("load")
    plain = api.tmp / "plain.bin"
    torch.save({"w": torch.arange(3.0), "n": 3, "s": "x", "a": np.arange(3), "l": [1.5]}, plain)
    api.call("a plain checkpoint", load_, str(plain))
    api.call("map_location cpu", load_, str(plain), map_location="cpu")
    api.call("weights_only=False", load_, str(plain), weights_only=False)
    api.call("from a file object", load_, io.BytesIO(plain.read_bytes()))
    rng = api.tmp / "rng.bin"
    torch.save({"numpy": np.random.get_state(), "python": __import__("random").getstate()}, rng)
    api.call("numpy and python random states", load_, str(rng))
    custom = api.tmp / "custom.bin"
    torch.save({"ns": SimpleNamespace(a=1)}, custom)
    api.call("an arbitrary object", load_, str(custom))
    api.call("an arbitrary object, weights_only=False", load_, str(custom), weights_only=False)
    api.call("a missing file", load_, str(api.tmp / "missing.bin"))
    before = torch.serialization.get_safe_globals()
    try:
        api.call("after a load", load_, str(plain))
        api.observe("the safe globals are as before (in any order)", lambda: {
            id(allowed) for allowed in torch.serialization.get_safe_globals()} == {id(allowed) for allowed in before})
        torch.serialization.add_safe_globals([SimpleNamespace])
        api.call("with a safe global of the caller's", load_, str(custom))
        api.observe("the caller's safe global is kept", lambda: SimpleNamespace in
                    torch.serialization.get_safe_globals())
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


@probe(AREA)
def get_pretty_name(api: Api) -> None:
    name = _path("get_pretty_name")
    for label, obj in {"a function": _shape, "a class": Tower, "an instance": Tower(), "a method": Tower.forward,
                       "a bound method": Tower().forward, "a partial": partial(print, 1), "a string": "text",
                       "an int": 3, "None": None, "a module": torch.nn, "a builtin": len,
                       "a lambda": lambda: None}.items():
        api.call(label, name, obj)


@probe(AREA)
def merge_dicts(api: Api) -> None:
    merge = _path("merge_dicts")
    destination = {"a": 1, "nested": {"x": 1, "keep": True}, "replace": {"deep": 1}}
    merged = api.call("nested", merge, {"b": 2, "nested": {"x": 2, "y": {"z": 3}}, "replace": 5}, destination)
    api.observe("into the destination", lambda: merged is destination)
    api.call("a dict over a value", merge, {"a": {"b": 1}}, {"a": 1})
    api.call("empty", merge, {}, {})
    api.call("not a dict", merge, [("a", 1)], {})


@probe(AREA)
def ports(api: Api) -> None:
    free = api.get(_path("get_free_port"))()  # its value differs from run to run: what it is is compared
    api.observe("get_free_port gives a port number", lambda: isinstance(free, int) and 0 < free < 65536)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("localhost", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        api.observe("a port in use", lambda: api.get(_path("is_port_in_use"))(port))
    api.observe("a port no longer in use", lambda: api.get(_path("is_port_in_use"))(port))
    api.observe("the default port", lambda: type(api.get(_path("is_port_in_use"))()))
    api.call("a port out of range", _path("is_port_in_use"), 70000)


@probe(AREA)
def convert_bytes(api: Api) -> None:
    for size in (0, 1, 1023, 1024, 1536, 10 ** 6, 123456789, 10 ** 12, 2 ** 50, 10 ** 18, 1023.999, -5):
        api.call(repr(size), _path("convert_bytes"), size)
    api.call("a string", _path("convert_bytes"), "1024")


@probe(AREA, worlds=(1, 2))
def check_os_kernel(api: Api) -> None:
    real = platform.uname
    try:
        for label, system, release in (("an old Linux kernel", "Linux", "4.19.0-25-generic"),
                                       ("a recent Linux kernel", "Linux", "6.1.0-13-amd64"),
                                       ("a WSL kernel", "Linux", "5.15.90.1-microsoft-standard-WSL2"),
                                       ("a two-part release", "Linux", "6.1"),
                                       ("macOS", "Darwin", "23.1.0")):
            platform.uname = lambda system=system, release=release: SimpleNamespace(system=system, release=release)
            api.call(f"{label}, before any state", _path("check_os_kernel"))
            api.partial_state()
            api.call(label, _path("check_os_kernel"))
    finally:
        platform.uname = real


@probe(AREA)
def recursive_getattr(api: Api) -> None:
    getter = _path("recursive_getattr")
    model = Tower()
    api.call("one level", getter, model, "head")
    api.call("two levels", getter, model, "head.weight")
    api.call("through a ModuleList", getter, model, "blocks.1.linear.bias")
    api.call("a missing attribute", getter, model, "head.missing")
    api.call("an empty path", getter, model, "")
    api.call("not a string", getter, model, 3)


@probe(AREA)
def get_module_children_bottom_up(api: Api) -> None:
    model = torch.nn.Sequential(Tower(), torch.nn.Sequential(torch.nn.ReLU(), Block()))
    children = _path("get_module_children_bottom_up")
    api.observe("modules", lambda: [type(m).__name__ for m in api.get(children)(model)])
    api.observe("model last", lambda: api.get(children)(model)[-1] is model)
    api.observe("names", lambda: [(name, type(m).__name__) for name, m in api.get(children)(model, return_fqns=True)])
    api.observe("a leaf", lambda: [type(m).__name__ for m in api.get(children)(torch.nn.ReLU())])
    api.observe("a leaf with names", lambda: api.get(children)(torch.nn.ReLU(), return_fqns=True)[0][0])


@probe(AREA, families=("cpu", "cuda"))
def write_basic_config(api: Api) -> None:
    """HF's ``utils.other`` re-exports ``write_basic_config``: the config it writes depends on the devices."""
    write = _path("write_basic_config")
    path = api.call("no precision", write, save_location=str(api.tmp / "nested" / "config.json"))
    api.observe("returns the path", lambda: str(path))
    api.call("an existing file", write, mixed_precision="bf16", save_location=str(api.tmp / "nested" / "config.json"))
    api.call("upper-case precision", write, mixed_precision="FP16", save_location=str(api.tmp / "fp16.json"))
    api.call("an unknown precision", write, mixed_precision="fp32", save_location=str(api.tmp / "fp32.json"))
    api.call("a yaml location", write, mixed_precision="fp8", save_location=str(api.tmp / "config.yaml"))
