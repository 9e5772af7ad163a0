"""Probes of ``accelerate.big_modeling``: empty init, CPU and disk offload, dispatching, loading and dispatching,
layerwise casting.

The CPU family runs every map whose accelerators are the CPU; the CUDA
family (two mock GPUs per rank) the maps over ``0``, ``1``, ``"cpu"`` and
``"disk"``, where HF moves modules between devices and wraps ``model.cuda``.
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from torch import nn

from ..probe import Api, probe
from ._models import TWO_GPUS, Net, Tied, hooks_of, net_input, placement, quiet



def _built_inside(api: Api, context_name: str, *args, **kwargs):
    with api.get(context_name)(*args, **kwargs) as yielded:
        model = Net()
        marked = nn.Parameter(torch.ones(2))
        marked._is_hf_initialized = True
        model.register_parameter("marked", marked)
    return {"yielded": yielded, "placement": placement(model),
            "mark kept": getattr(model.marked, "_is_hf_initialized", None),
            "register_parameter restored": nn.Module.register_parameter is _ORIGINAL_REGISTER}


_ORIGINAL_REGISTER = nn.Module.register_parameter


@probe("big_modeling")
def empty_weights(api: Api) -> None:
    api.observe("init_empty_weights", _built_inside, api, "init_empty_weights")
    api.observe("init_empty_weights with buffers", _built_inside, api, "init_empty_weights", include_buffers=True)
    api.observe("init_on_device cpu", _built_inside, api, "init_on_device", torch.device("cpu"))
    api.observe("init_on_device meta with buffers", _built_inside, api, "init_on_device", torch.device("meta"),
                include_buffers=True)
    api.observe("init_on_device a device string with buffers", _built_inside, api, "init_on_device", "meta",
                include_buffers=True)
    api.observe("init_on_device a device string", _built_inside, api, "init_on_device", "meta")

    def raising_inside():
        with api.get("init_empty_weights")():
            raise KeyError("inside")

    api.observe("an error inside", raising_inside)
    api.record("register_parameter restored after the error", nn.Module.register_parameter is _ORIGINAL_REGISTER)


@probe("big_modeling", env={"ACCELERATE_INIT_INCLUDE_BUFFERS": "1"})
def empty_weights_buffers_from_the_environment(api: Api) -> None:
    api.observe("init_empty_weights", _built_inside, api, "init_empty_weights")
    api.observe("init_empty_weights, buffers refused", _built_inside, api, "init_empty_weights", include_buffers=False)


@probe("big_modeling", families=("cpu", "cuda"), env=TWO_GPUS)
def offload_to_cpu(api: Api) -> None:
    device = "cuda:0" if api.family == "cuda" else "cpu"
    expected = Net()(net_input())
    model = Net()
    api.call("cpu_offload", "cpu_offload", model, execution_device=device)
    api.record("hooks", hooks_of(model))
    api.record("placement", placement(model))
    api.observe("forward", lambda: torch.allclose(model(net_input()), expected))
    api.record("placement after forward", placement(model))
    given = Net()
    state = {k: v * 0 for k, v in given.state_dict().items()}
    api.call("cpu_offload a given state dict, buffers too", "cpu_offload", given, device, True, state, ["Block"])
    api.record("given: hooks", hooks_of(given))
    api.observe("given: forward", given, net_input())
    default = Net()
    api.call("cpu_offload to the first weight's device", "cpu_offload", default)
    api.record("default: hooks", hooks_of(default))


@probe("big_modeling", families=("cpu", "cuda"), env=TWO_GPUS)
def offload_with_hook(api: Api) -> None:
    device = "cuda:0" if api.family == "cuda" else "cpu"
    first, second = Net(), Net()
    result = api.call("cpu_offload_with_hook", "cpu_offload_with_hook", first, device)
    hook = result[1] if result else None
    result = api.call("chained", "cpu_offload_with_hook", second, device, prev_module_hook=hook)
    second_hook = result[1] if result else None
    api.record("hooks", [hooks_of(first), hooks_of(second)])
    api.observe("first forward", lambda: first(net_input()).device)
    api.observe("second forward", lambda: second(net_input()).device)
    api.record("devices", [str(next(first.parameters()).device), str(next(second.parameters()).device)])
    if second_hook is not None:
        api.observe("offload", second_hook.offload)
        api.record("after offload", str(next(second.parameters()).device))
        api.observe("remove", second_hook.remove)
        api.record("hooks after remove", hooks_of(second))
    default = Net()
    result = api.call("default device", "cpu_offload_with_hook", default)
    if result:
        api.record("default execution device", result[1].hook.execution_device)


@probe("big_modeling")
def offload_to_disk(api: Api) -> None:
    expected = Net()(net_input())
    model = Net()
    folder = str(api.tmp / "offload")
    api.call("disk_offload", "disk_offload", model, folder, execution_device="cpu")
    api.record("hooks", hooks_of(model))
    api.record("placement", placement(model))
    api.observe("forward", lambda: torch.allclose(model(net_input()), expected))
    again = Net()
    api.call("disk_offload onto an existing index", "disk_offload", again, folder, offload_buffers=True,
             preload_module_classes=["Block"])
    api.record("existing index: hooks", hooks_of(again))
    api.observe("existing index: forward uses the stored weights", lambda: torch.allclose(again(net_input()), expected))


def _dispatch_observations(api: Api, label: str, model: nn.Module, *args, **kwargs) -> None:
    api.call(label, "dispatch_model", model, *args, **kwargs)
    api.record(f"{label}: hooks", hooks_of(model))
    api.record(f"{label}: placement", placement(model))
    api.record(f"{label}: hf_device_map", getattr(model, "hf_device_map", None))
    api.record(f"{label}: wrapped methods", sorted(k for k in ("to", "cuda", "npu", "xpu") if k in vars(model)))


@probe("big_modeling")
def dispatch_on_the_cpu(api: Api) -> None:
    expected = Net()(net_input())
    _dispatch_observations(api, "one device", Net(), {"": "cpu"})
    forced = Net()
    _dispatch_observations(api, "one device, forced hooks", forced, {"": "cpu"}, force_hooks=True)
    api.observe("forced: forward", forced, net_input())
    model = Net()
    device_map = {"embed": "cpu", "blocks.0": "disk", "blocks.1": "cpu", "head": "disk", "scale": "cpu", "cache": "cpu"}
    _dispatch_observations(api, "cpu and disk", model, device_map, offload_dir=str(api.tmp / "disk"))
    api.observe("cpu and disk: forward", lambda: torch.allclose(model(net_input()), expected))
    api.observe("move a dispatched model to the cpu", lambda: model.to("cpu") is model)
    api.observe("move it to a dtype", lambda: model.to(torch.float32) is model)
    api.observe("move it with cuda()", lambda: model.cuda() is model)
    api.call("disk without an offload_dir", "dispatch_model", Net(), device_map)
    api.call("a map leaving weights out", "dispatch_model", Net(), {"embed": "cpu", "blocks": "cpu"})
    api.call("a map with an unknown key", "dispatch_model", Net(), {"": "cpu", "trunk": "cpu"})
    whole_disk = Net()
    _dispatch_observations(api, "all on disk", whole_disk, {"": "disk"}, offload_dir=str(api.tmp / "whole"))
    api.call("all on disk without a folder", "dispatch_model", Net(), {"": "disk"})
    state = Net().state_dict()
    skipping = Net()
    _dispatch_observations(api, "main device and skip keys", skipping, {"embed": "cpu", "blocks": "cpu", "head": "cpu",
                                                                         "scale": "cpu", "cache": "cpu"},
                           main_device="cpu", state_dict=state, skip_keys=["mask"], force_hooks=True)
    tied = Tied()
    _dispatch_observations(api, "tied", tied, {"embed": "cpu", "body": "disk", "head": "cpu"},
                           offload_dir=str(api.tmp / "tied"), offload_buffers=True, preload_module_classes=["Linear"])
    api.record("tied: still tied", tied.embed.weight is tied.head.weight)
    api.record("tied: entries of each hook's tied-weights map",
               {name: len(module._hf_hook.tied_params_map) for name, module in tied.named_modules()
                if getattr(getattr(module, "_hf_hook", None), "tied_params_map", None) is not None})
    api.observe("tied: forward", lambda: tied(torch.tensor([[1, 2]])).shape)


@probe("big_modeling", families=("cuda",), env=TWO_GPUS)
def dispatch_on_gpus(api: Api) -> None:
    expected = Net()(net_input())
    single = Net()
    _dispatch_observations(api, "one GPU", single, {"": 1})
    spread = Net()
    device_map = {"embed": 0, "blocks.0": 1, "blocks.1": "cpu", "head": "disk", "scale": 0, "cache": 0}
    _dispatch_observations(api, "two GPUs, cpu and disk", spread, device_map, offload_dir=str(api.tmp / "disk"))
    api.observe("forward", lambda: torch.allclose(spread(net_input()).cpu(), expected))
    api.observe("output device", lambda: spread(net_input()).device)
    api.observe("move it", lambda: spread.to("cuda:0") is spread)
    api.observe("move it with cuda()", lambda: spread.cuda() is spread)
    on_gpus = Net()
    _dispatch_observations(api, "two GPUs", on_gpus, {"embed": 0, "blocks": 1, "head": 1, "scale": 1, "cache": 0})
    api.observe("two GPUs: forward", lambda: torch.allclose(on_gpus(net_input()).cpu(), expected))
    api.observe("two GPUs: move it", lambda: on_gpus.to("cuda:1") is on_gpus)
    api.observe("two GPUs: to a dtype", lambda: on_gpus.to(torch.float32) is on_gpus)
    main = Net()
    _dispatch_observations(api, "main device given", main, {"embed": 1, "blocks": "cpu", "head": 0, "scale": 0,
                                                             "cache": 0}, main_device=0)
    api.observe("main device given: forward", lambda: main(net_input()).device)


def _checkpoint(api: Api) -> str:
    path = str(api.tmp / "model.safetensors")
    save_file({k: v.contiguous() for k, v in Net().state_dict().items()}, path, metadata={"format": "pt"})
    return path


def _empty(api: Api) -> nn.Module:
    with api.get("init_empty_weights")():
        return Net()


@probe("big_modeling")
def load_and_dispatch_on_the_cpu(api: Api) -> None:
    path = _checkpoint(api)
    expected = Net()(net_input())
    load = "load_checkpoint_and_dispatch"
    api.call("an unknown strategy", load, _empty(api), path, device_map="fastest")
    model = _empty(api)
    api.call("no map", load, model, path)
    api.observe("no map: forward", lambda: torch.allclose(model(net_input()), expected))
    for strategy in ("sequential", "auto", "balanced", "balanced_low_0"):
        model = _empty(api)
        api.call(f"{strategy}", load, model, path, device_map=strategy, max_memory={"cpu": 10**6},
                 no_split_module_classes=["Block"])
        api.record(f"{strategy}: hf_device_map", getattr(model, "hf_device_map", None))
    model = _empty(api)
    api.observe("sequential spilling to disk", quiet, api.get(load), model, path, device_map="sequential",
                max_memory={"cpu": 250}, no_split_module_classes=["Block"], offload_folder=str(api.tmp / "spill"))
    api.record("spilling: hf_device_map", getattr(model, "hf_device_map", None))
    api.record("spilling: placement", placement(model))
    api.observe("spilling: forward", lambda: torch.allclose(model(net_input()), expected))
    model = _empty(api)
    api.call("a map, float16, staged state dict", load, model, path, device_map={"": "cpu"}, dtype="float16",
             offload_state_dict=True, force_hooks=True, skip_keys="mask")
    api.record("float16: placement", placement(model))
    api.call("sequential spilling without a folder", load, _empty(api), path, device_map="sequential",
             max_memory={"cpu": 250})
    api.call("strict with a map", load, _empty(api), path, device_map={"": "cpu"}, strict=True)


@probe("big_modeling", families=("cuda",), env=TWO_GPUS)
def load_and_dispatch_on_gpus(api: Api) -> None:
    path = _checkpoint(api)
    expected = Net()(net_input())
    for strategy in ("auto", "balanced_low_0", "sequential"):
        model = _empty(api)
        api.observe(strategy, quiet, api.get("load_checkpoint_and_dispatch"), model, path, device_map=strategy,
                    max_memory={0: 250, 1: 250, "cpu": 10**6})
        api.record(f"{strategy}: hf_device_map", getattr(model, "hf_device_map", None))
        api.record(f"{strategy}: placement", placement(model))
        api.observe(f"{strategy}: forward", lambda m=model: torch.allclose(m(net_input()).cpu(), expected))
    model = _empty(api)
    api.observe("auto without budgets", quiet, api.get("load_checkpoint_and_dispatch"), model, path, device_map="auto")
    api.record("auto without budgets: hf_device_map", getattr(model, "hf_device_map", None))


@probe("big_modeling", families=("cpu", "cuda"))
def layerwise_casting(api: Api) -> None:
    attach = "big_modeling.attach_layerwise_casting_hooks"
    model = Net()
    if api.family == "cuda":
        model = model.to("cuda:0")
    inputs = net_input().to(next(model.parameters()).device)
    api.call("every layer", attach, model, torch.float16, torch.float32)
    api.record("every layer: hooks", hooks_of(model))
    api.record("every layer: placement", placement(model))
    api.observe("every layer: forward", lambda: model(inputs).dtype)
    api.record("every layer: placement after forward", placement(model))
    skipped = Net()
    api.call("skip a pattern and a class", attach, skipped, torch.bfloat16, torch.float32,
             skip_modules_pattern=("head", r"blocks\.1"), skip_modules_classes=(nn.BatchNorm1d,), non_blocking=True)
    api.record("skipped: hooks", hooks_of(skipped))
    api.record("skipped: placement", placement(skipped))
    letters = Net()
    api.call("a pattern given as a string", attach, letters, torch.float16, torch.float32, skip_modules_pattern="head")
    api.record("string pattern: hooks", sorted(hooks_of(letters)))
    twice = Net()
    attach_hooks = api.get(attach)
    attach_hooks(twice, torch.float16, torch.float32)
    api.call("attached twice", attach, twice, torch.bfloat16, torch.float32)
    api.record("twice: hooks", hooks_of(twice))
    api.call("a bare layer", attach, nn.Linear(2, 2), torch.float16, torch.float32)
    api.call("not a module", attach, "model", torch.float16, torch.float32)
