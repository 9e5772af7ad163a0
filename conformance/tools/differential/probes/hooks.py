"""Probes of ``accelerate.hooks``: hooks around ``forward``, chaining, removal, device alignment, CPU offload hooks.

The CUDA family runs the hooks that move weights and inputs between the
mock GPUs and the CPU, where HF compares devices and moves modules.
"""

from __future__ import annotations

import torch
from torch import nn

from ..probe import Api, probe
from ._models import TWO_GPUS, Net, describe_hook, hooks_of, net_input, placement



def _recording_hook(api: Api, calls: list, tag: str):
    """A ModelHook subclass (of the implementation's class) that logs each call and doubles the input."""
    base = api.get("hooks.ModelHook")

    class Recording(base):
        def init_hook(self, module):
            calls.append(f"{tag}.init")
            return module

        def pre_forward(self, module, *args, **kwargs):
            calls.append(f"{tag}.pre")
            return tuple(a * 2 for a in args), kwargs

        def post_forward(self, module, output):
            calls.append(f"{tag}.post")
            return output + 1

        def detach_hook(self, module):
            calls.append(f"{tag}.detach")
            return module

    return Recording()


@probe("hooks")
def model_hook_defaults(api: Api) -> None:
    hook = api.get("hooks.ModelHook")()
    module = nn.Linear(2, 2)
    api.observe("init_hook", lambda: hook.init_hook(module) is module)
    api.observe("pre_forward", hook.pre_forward, module, torch.ones(2), scale=3)
    api.observe("post_forward", hook.post_forward, module, torch.ones(2))
    api.observe("detach_hook", lambda: hook.detach_hook(module) is module)
    api.record("no_grad", hook.no_grad)
    calls: list = []
    sequence = api.get("hooks.SequentialHook")(_recording_hook(api, calls, "a"), _recording_hook(api, calls, "b"))
    api.record("sequential hook", sequence)
    api.observe("sequential init", lambda: sequence.init_hook(module) is module)
    api.observe("sequential pre_forward", sequence.pre_forward, module, torch.ones(2), flag=True)
    api.observe("sequential post_forward", sequence.post_forward, module, torch.zeros(2))
    api.observe("sequential detach", lambda: sequence.detach_hook(module) is module)
    api.record("sequential calls", calls)
    api.record("empty sequence", api.get("hooks.SequentialHook")().pre_forward(module, 1, k=2))


@probe("hooks")
def add_and_remove_hooks(api: Api) -> None:
    add, remove = api.get("hooks.add_hook_to_module"), api.get("hooks.remove_hook_from_module")
    calls: list = []
    module = nn.Linear(2, 2)
    with torch.no_grad():
        module.weight.copy_(torch.eye(2))
        module.bias.zero_()
    api.observe("add", lambda: add(module, _recording_hook(api, calls, "a")) is module)
    api.observe("forward through the hook", module, torch.ones(2))
    api.record("forward keeps the name", [module.forward.__name__, "forward" in vars(module)])
    api.observe("append", lambda: add(module, _recording_hook(api, calls, "b"), append=True) is module)
    api.record("appended hook", describe_hook(module._hf_hook))
    api.observe("forward through both", module, torch.ones(2))
    api.observe("replace", lambda: add(module, _recording_hook(api, calls, "c")) is module)
    api.observe("forward through the replacement", module, torch.ones(2))
    api.record("calls", list(calls))
    api.observe("remove", lambda: remove(module) is module)
    api.record("after removal", [hasattr(module, "_hf_hook"), hasattr(module, "_old_forward"), "forward" in vars(module)])
    api.observe("plain forward again", module, torch.ones(2))
    api.record("calls after removal", calls)
    api.observe("remove without a hook", lambda: remove(nn.Linear(2, 2)) is not None)

    class NoGrad(api.get("hooks.ModelHook")):
        no_grad = True

    graded = nn.Linear(2, 2)
    add(graded, NoGrad())
    api.observe("no_grad hook", lambda: graded(torch.ones(2)).requires_grad)
    model = Net()
    for name, sub in model.named_modules():
        add(sub, api.get("hooks.ModelHook")())
    added = {name: "to" in vars(sub) for name, sub in model.named_modules()}
    model.to = lambda *a, **k: None
    api.observe("remove recursively", lambda: remove(model, recurse=True) is model)
    api.record("hooks left", hooks_of(model))
    api.record("attributes left", [added, "to" in vars(model)])
    nested = Net()
    for name, sub in nested.named_modules():
        add(sub, api.get("hooks.ModelHook")())
    api.call("remove_hook_from_submodules", "hooks.remove_hook_from_submodules", nested)
    api.record("hooks left on submodules", sorted(hooks_of(nested)))


@probe("hooks")
def hooks_on_a_traced_module(api: Api) -> None:
    traced = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    calls: list = []
    add, remove = api.get("hooks.add_hook_to_module"), api.get("hooks.remove_hook_from_module")
    api.observe("add", lambda: add(traced, _recording_hook(api, calls, "g")) is traced)
    api.record("where forward lives", ["forward" in vars(traced), "forward" in vars(type(traced))])
    api.observe("forward", lambda: traced(torch.ones(2)).shape)
    remove(traced)
    api.observe("forward after removal", lambda: traced(torch.ones(2)).shape)
    api.record("calls", calls)


@probe("hooks")
def align_devices_hook(api: Api) -> None:
    align = api.get("hooks.AlignDevicesHook")
    add, remove = api.get("hooks.add_hook_to_module"), api.get("hooks.remove_hook_from_module")
    hook = align(execution_device="cpu", io_same_device=True, skip_keys="mask")
    api.record("repr", repr(hook))
    api.record("attributes", [hook.execution_device, hook.offload, hook.io_same_device, hook.weights_map,
                              hook.offload_buffers, hook.place_submodules, hook.skip_keys, hook.input_device,
                              hook.tied_params_map, getattr(hook, "tied_params_names", None),
                              getattr(hook, "param_original_devices", None)])
    api.record("defaults", repr(align()))
    model = Net()
    state = model.state_dict()
    add(model.embed, align(execution_device="cpu"))
    api.observe("on cpu, forward", model.embed, net_input())
    offloaded = nn.Sequential(Net())
    hook = align(execution_device="cpu", offload=True, io_same_device=True)
    api.observe("offload, weights map made from the module", lambda: add(offloaded[0].embed, hook) is offloaded[0].embed)
    api.record("offload: placement", placement(offloaded))
    api.record("offload: weights map", dict(hook.weights_map))
    api.record("offload: original devices", getattr(hook, "original_devices", None))
    api.observe("offload: forward", offloaded[0].embed, net_input())
    api.record("offload: placement after forward", placement(offloaded))
    api.observe("offload: detach restores", lambda: remove(offloaded[0].embed) is not None)
    api.record("offload: placement after removal", placement(offloaded))
    api.record("offload: values after removal", offloaded[0].embed.state_dict())
    buffered = Net()
    buffered.blocks[0].norm.register_buffer("scratch", torch.ones(1), persistent=False)
    for offload_buffers in (False, True):
        target = Net()
        target.register_buffer("scratch", torch.ones(1), persistent=False)
        weights = {k: v for k, v in state.items()}
        add(target, align(execution_device="cpu", offload=True, weights_map=weights, offload_buffers=offload_buffers,
                          place_submodules=True))
        api.record(f"offload buffers {offload_buffers}: placement", placement(target))
        api.observe(f"offload buffers {offload_buffers}: forward", target, net_input())
    meta_hook = align(execution_device="meta", tied_params_map={1: {}})
    add(nn.Linear(2, 2), meta_hook)
    api.record("meta execution device forgets the tied map", [meta_hook.tied_params_map, meta_hook.offload])
    none_hook = align()
    plain = nn.Linear(2, 2)
    add(plain, none_hook)
    api.observe("no execution device", plain, torch.ones(2))
    api.observe("pre_forward without a device", none_hook.pre_forward, plain, torch.ones(2), mask=torch.ones(1))
    skip = align(execution_device="meta", io_same_device=True, skip_keys=["mask"])
    api.observe("skip keys", lambda: skip.pre_forward(plain, torch.ones(1), mask=torch.ones(1), other=torch.ones(1)))


@probe("hooks", families=("cpu", "cuda"), env=TWO_GPUS)
def align_devices_hook_on_a_device(api: Api) -> None:
    device = "cuda:1" if api.family == "cuda" else "cpu"
    align = api.get("hooks.AlignDevicesHook")
    add, remove = api.get("hooks.add_hook_to_module"), api.get("hooks.remove_hook_from_module")
    model = Net()
    add(model, align(execution_device=device, io_same_device=True, place_submodules=True))
    api.record("moved", placement(model))
    api.observe("forward: output back where the input was", model, net_input())
    api.observe("forward with a keyword", lambda: model(x=net_input()))
    buffered = Net()
    add(buffered, align(execution_device=device, offload=True, offload_buffers=True, place_submodules=True))
    api.record("offload buffers: placement", placement(buffered))
    offloaded = Net()
    add(offloaded.head, align(execution_device=device, offload=True, io_same_device=True))
    api.record("offloaded head", placement(offloaded.head))
    api.observe("offloaded head forward", offloaded.head, torch.ones(1, 4))
    api.record("offloaded head after forward", placement(offloaded.head))
    remove(offloaded.head)
    api.record("offloaded head after removal", placement(offloaded.head))


@probe("hooks", families=("cpu", "cuda"), env=TWO_GPUS)
def attach_hooks_to_a_tree(api: Api) -> None:
    device = "cuda:0" if api.family == "cuda" else "cpu"
    model = Net()
    state = model.state_dict()
    api.call("attach_align_device_hook", "hooks.attach_align_device_hook", model, execution_device=device,
             offload=True, weights_map=state, module_name="", skip_keys="mask")
    api.record("align: hooks", hooks_of(model))
    api.record("align: placement", placement(model))
    api.observe("align: forward", lambda: model(net_input()))
    preload = Net()
    api.call("attach_align_device_hook preload Block", "hooks.attach_align_device_hook", preload,
             execution_device=device, offload=True, preload_module_classes=["Block"])
    api.record("preload: hooks", hooks_of(preload))
    api.observe("preload: forward (weights map made from the blocks)", lambda: preload(net_input()))
    plain = Net()
    api.call("attach_align_device_hook without offload", "hooks.attach_align_device_hook", plain, execution_device=device)
    api.record("without offload: hooks", hooks_of(plain))
    api.record("without offload: placement", placement(plain))
    executing = Net()
    api.call("attach_execution_device_hook", "hooks.attach_execution_device_hook", executing, device,
             skip_keys=["mask"], preload_module_classes=["Block"])
    api.record("execution: hooks", hooks_of(executing))
    api.call("attach_execution_device_hook twice", "hooks.attach_execution_device_hook", executing, device)
    api.record("execution twice: hooks", hooks_of(executing))
    one_tensor = nn.Sequential(nn.Linear(3, 4, bias=False), nn.ReLU(), nn.Linear(4, 2))
    api.call("attach_execution_device_hook, a module of one tensor", "hooks.attach_execution_device_hook", one_tensor,
             device)
    api.record("one tensor: hooks", hooks_of(one_tensor))


@probe("hooks", families=("cpu", "cuda"), env=TWO_GPUS)
def attach_hooks_on_blocks(api: Api) -> None:
    gpu = (lambda i: i) if api.family == "cuda" else (lambda i: "cpu")
    blocks = "hooks.attach_align_device_hook_on_blocks"
    whole = Net()
    api.call("one device, no offload", blocks, whole, execution_device=gpu(0))
    api.record("one device: hooks", hooks_of(whole))
    offloaded = Net()
    api.call("one device, offload", blocks, offloaded, execution_device=gpu(0), offload=True,
             weights_map=offloaded.state_dict())
    api.record("one device, offload: hooks", hooks_of(offloaded))
    api.observe("one device, offload: forward", offloaded, net_input())
    mapped = Net()
    state = mapped.state_dict()
    execution = {"": gpu(0), "embed": gpu(0), "blocks": gpu(1), "head": gpu(0), "scale": gpu(0), "cache": gpu(0)}
    offload = {"": False, "embed": False, "blocks": True, "head": False, "scale": False, "cache": False}
    api.call("per block", blocks, mapped, execution_device=execution, offload=offload, weights_map=state,
             skip_keys="mask", preload_module_classes=["Block"])
    api.record("per block: hooks", hooks_of(mapped))
    api.record("per block: placement", placement(mapped))
    api.observe("per block: forward", mapped, net_input())
    partial = Net()
    api.call("offload as one bool", blocks, partial, execution_device={"": gpu(0), "blocks": gpu(1)}, offload=False)
    api.record("offload as one bool: hooks", hooks_of(partial))
    by_name = Net()
    api.call("device as one value", blocks, by_name, execution_device=gpu(0), offload={"embed": True, "": False},
             weights_map=by_name.state_dict())
    api.record("device as one value: hooks", hooks_of(by_name))


@probe("hooks", families=("cpu", "cuda"), env=TWO_GPUS)
def cpu_offload_hooks(api: Api) -> None:
    device = "cuda:0" if api.family == "cuda" else "cpu"
    offload = api.get("hooks.CpuOffload")
    default = offload()
    api.record("default execution device", default.execution_device)
    api.record("default previous hook", default.prev_module_hook)
    first, second = Net(), Net()
    add = api.get("hooks.add_hook_to_module")
    hook_one = offload(execution_device=device)
    add(first, hook_one)
    user_one = api.get("hooks.UserCpuOffloadHook")(first, hook_one)
    hook_two = offload(execution_device=device, prev_module_hook=user_one)
    add(second, hook_two)
    user_two = api.get("hooks.UserCpuOffloadHook")(second, hook_two)
    api.record("after init", [placement(first)["embed.weight"], placement(second)["embed.weight"]])
    api.observe("first forward", first, net_input())
    api.record("after the first", [placement(first)["embed.weight"], placement(second)["embed.weight"]])
    api.observe("second forward", second, net_input().to(device))
    api.record("after the second", [placement(first)["embed.weight"], placement(second)["embed.weight"]])
    api.observe("pre_forward when already there", hook_two.pre_forward, second, net_input())
    on_device = offload(execution_device=torch.device(device))
    resident = Net()
    add(resident, on_device)
    inputs = [net_input()]
    api.observe("pre_forward on the device already (a torch.device) hands the inputs on as they are",
                lambda: on_device.pre_forward(resident, inputs)[0][0] is inputs)
    api.observe("post_forward", lambda: hook_two.post_forward(second, torch.ones(1)))
    api.observe("detach_hook", lambda: hook_two.detach_hook(second) is second)
    api.observe("offload", user_two.offload)
    api.record("after offload", placement(second)["embed.weight"])
    api.observe("remove", user_two.remove)
    api.record("after remove", [hasattr(second, "_hf_hook"), user_two.model is second, user_two.hook is hook_two])
    not_a_user_hook = offload(execution_device=device, prev_module_hook="a string")
    third = Net()
    add(third, not_a_user_hook)
    api.observe("a previous hook that is no UserCpuOffloadHook", third, net_input())


@probe("hooks", families=("cpu", "cuda"))
def layerwise_casting_hook(api: Api) -> None:
    cast = api.get("hooks.LayerwiseCastingHook")
    hook = cast(torch.float16, torch.float32, False)
    api.record("attributes", [hook.storage_dtype, hook.compute_dtype, hook.non_blocking, cast._is_stateful])
    layer = nn.Linear(2, 2)
    if api.family == "cuda":
        layer = layer.to("cuda:0")
    api.observe("init_hook", lambda: hook.init_hook(layer) is layer)
    api.record("stored", placement(layer))
    api.observe("pre_forward", hook.pre_forward, layer, torch.ones(2), k=1)
    api.record("computing", placement(layer))
    api.observe("post_forward", hook.post_forward, layer, torch.ones(2))
    api.record("stored again", placement(layer))
    api.call("missing a dtype", "hooks.LayerwiseCastingHook", torch.float16, torch.float32)


@probe("hooks")
def offloaded_int8_statistics(api: Api) -> None:
    """The 8-bit statistics (``SCB``) an offloaded int8 ``weight`` brings along; a float weight or an int8 bias none."""
    align, add = api.get("hooks.AlignDevicesHook"), api.get("hooks.add_hook_to_module")
    for label, weight, bias in (("float", torch.ones(2, 2), torch.ones(2)),
                                ("int8", torch.ones(2, 2, dtype=torch.int8), torch.ones(2, dtype=torch.int8))):
        layer = nn.Linear(2, 2)
        layer.weight = nn.Parameter(weight.clone(), requires_grad=False)
        layer.bias = nn.Parameter(bias.clone(), requires_grad=False)
        weights = {"weight": weight, "bias": bias, "SCB": torch.full((2,), 3.0), "bias.SCB": torch.full((2,), 5.0)}
        hook = align(execution_device="cpu", offload=True, weights_map=weights)
        add(layer, hook)
        hook.pre_forward(layer, torch.ones(2))
        api.record(f"{label}: statistics during the forward",
                   {name: getattr(tensor, "SCB", None) for name, tensor in layer.named_parameters()})


@probe("hooks")
def hooks_under_torch_compile(api: Api) -> None:
    """Hooks run outside torch.compile's graphs (HF wraps them in ``torch.compiler.disable``): the graphs and breaks
    dynamo finds in a hooked model."""
    import torch._dynamo as dynamo

    add, align = api.get("hooks.add_hook_to_module"), api.get("hooks.AlignDevicesHook")
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    add(model[0], align(execution_device="cpu", io_same_device=True))
    calls: list = []
    add(model[2], api.get("hooks.SequentialHook")(_recording_hook(api, calls, "a"), _recording_hook(api, calls, "b")))
    offloaded = nn.Linear(3, 2)
    add(offloaded, align(execution_device="cpu", offload=True))
    for label, target in (("align and sequential hooks", model), ("offloaded", offloaded)):
        dynamo.reset()
        explained = dynamo.explain(target)(torch.ones(2, 3))
        # The recording hooks' own ops (doubling, adding one) are in a graph only if dynamo traced the hook.
        api.record(f"{label}: graphs, breaks, ops in graphs",
                   [explained.graph_count, explained.graph_break_count, explained.op_count])
