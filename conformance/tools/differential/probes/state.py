"""Probes of ``accelerate.state``: `PartialState`, `AcceleratorState` and `GradientState` (their properties,
process control, refusals and texts after a reset), ``is_initialized`` and ``ThreadLocalSharedDict``.

The CUDA family runs what depends on the device (device, backend, the ``cpu=True`` refusal of a built state).
"""

from __future__ import annotations

import os

import torch

from ..probe import Api, probe

AREA = "state"
PARTIAL_PROPERTIES = ("distributed_type", "backend", "device", "num_processes", "process_index",
                      "local_process_index", "use_distributed", "is_main_process", "is_local_main_process",
                      "is_last_process", "fork_launched", "debug", "initialized", "default_device")
ACCELERATOR_PROPERTIES = ("distributed_type", "device", "num_processes", "process_index", "local_process_index",
                          "mixed_precision", "use_distributed", "is_main_process", "is_local_main_process",
                          "is_last_process", "fork_launched", "is_fsdp2", "initialized", "deepspeed_plugin",
                          "dynamo_plugin", "fsdp_plugin", "parallelism_config", "device_mesh", "torch_tp_plugin",
                          "deepspeed_plugins", "debug", "backend")
GRADIENT_PROPERTIES = ("sync_gradients", "num_steps", "adjust_scheduler", "sync_with_dataloader",
                       "end_of_dataloader", "remainder", "in_dataloader", "active_dataloader",
                       "dataloader_references", "is_xla_gradients_synced", "plugin_kwargs", "initialized")


def _record(api: Api, obj, names, prefix: str = "") -> None:
    for name in names:
        api.observe(f"{prefix}{name}", getattr, obj, name)


def _shout(word: str) -> str:
    print(f"ran {word}")
    return word.upper()


@probe(AREA, worlds=(1, 2), families=("cpu", "cuda"))
def partial_state_properties(api: Api) -> None:
    state = api.partial_state()
    _record(api, state, PARTIAL_PROPERTIES)
    api.observe("repr", repr, state)
    api.observe("another instance shares the state", lambda: api.get("PartialState")().process_index)
    api.observe("is_initialized (AcceleratorState)", api.get("state.is_initialized"))


@probe(AREA, env={"ACCELERATE_TORCH_DEVICE": "cpu:3", "ACCELERATE_DEBUG_MODE": "1"})
def partial_state_from_the_environment(api: Api) -> None:
    state = api.partial_state()
    api.observe("device", getattr, state, "device")
    api.observe("debug", getattr, state, "debug")


@probe(AREA, env={"FORK_LAUNCHED": "1"})
def partial_state_fork_launched(api: Api) -> None:
    state = api.partial_state()
    api.observe("fork_launched", getattr, state, "fork_launched")
    api.observe("destroy_process_group", state.destroy_process_group)


@probe(AREA, worlds=(1, 2))
def partial_state_decorators(api: Api) -> None:
    state = api.partial_state()
    do_nothing = api.get("state.do_nothing")
    cases = {
        "on_main_process": lambda: state.on_main_process(_shout),
        "on_local_main_process": lambda: state.on_local_main_process(_shout),
        "on_last_process": lambda: state.on_last_process(_shout),
        "on_process(process_index=1)": lambda: state.on_process(process_index=1)(_shout),
        "on_process(fn, 0)": lambda: state.on_process(_shout, 0),
        "on_process without an index": lambda: state.on_process(_shout),
        "on_local_process(local_process_index=0)": lambda: state.on_local_process(local_process_index=0)(_shout),
        "on_local_process(fn, 1)": lambda: state.on_local_process(_shout, local_process_index=1),
        "on_main_process(None)": lambda: state.on_main_process(None),
    }
    for label, decorate in cases.items():
        decorated = api.observe(f"{label}: decorate", decorate)
        api.observe(f"{label}: is the function", lambda: decorated is _shout)
        api.observe(f"{label}: is do_nothing", lambda: decorated is do_nothing)
        if callable(decorated):
            api.observe(f"{label}: call", decorated, label)
    api.observe("do_nothing", do_nothing, 1, 2, key=3)
    api.observe("on_process without anything", lambda: type(state.on_process()).__name__)


@probe(AREA)
def partial_state_after_a_reset(api: Api) -> None:
    state = api.partial_state()
    api.get("PartialState")._reset_state()
    api.observe("initialized", getattr, state, "initialized")
    api.observe("a known attribute", getattr, state, "process_index")
    api.observe("device", getattr, state, "device")
    api.observe("an unknown attribute", getattr, state, "no_such_attribute")
    api.observe("is_main_process", getattr, state, "is_main_process")
    api.observe("on_main_process", state.on_main_process, _shout)
    api.observe("on_local_main_process", state.on_local_main_process, _shout)
    api.observe("print", state.print, "x")
    api.observe("wait_for_everyone", state.wait_for_everyone)
    api.observe("repr", repr, state)
    api.partial_state()
    api.observe("an unknown attribute when initialized", getattr, state, "no_such_attribute")


@probe(AREA, worlds=(1, 2))
def partial_state_process_control(api: Api) -> None:
    state = api.partial_state()
    api.observe("print", state.print, "hello", end="!\n")
    api.observe("wait_for_everyone", state.wait_for_everyone)
    order = []
    with state.main_process_first():
        order.append("main first")
    with state.local_main_process_first():
        order.append("local main first")
    api.record("blocks ran", order)

    def split(inputs, **kwargs):
        with state.split_between_processes(inputs, **kwargs) as share:
            return share

    api.observe("split a list", split, [1, 2, 3])
    api.observe("split a list, padded", split, [1, 2, 3], apply_padding=True)
    api.observe("split a tuple, padded", split, (1, 2, 3), apply_padding=True)
    api.observe("split a 2-d tensor", split, torch.arange(6).view(3, 2))
    api.observe("split a 2-d tensor, padded", split, torch.arange(6).view(3, 2), apply_padding=True)
    api.observe("split a dict", split, {"a": [1, 2, 3, 4], "b": (5, 6, 7, 8)})
    api.observe("split a dict, padded", split, {"a": [1, 2, 3], "b": torch.arange(3)}, apply_padding=True)
    api.observe("split a dict of unequal values", split, {"a": [1, 2], "b": [1, 2, 3]})
    api.observe("split a string", split, "abcd")
    api.observe("split a range", split, range(5))
    api.observe("split a set", split, {1, 2})
    api.observe("split None", split, None)
    api.observe("split an empty list, padded", split, [], apply_padding=True)


@probe(AREA)
def partial_state_backend_refusal(api: Api) -> None:
    api.observe("an explicit backend on one process", api.partial_state, backend="gloo")


@probe(AREA, worlds=(2,))
def partial_state_backend_refusal_distributed(api: Api) -> None:
    api.observe("a backend the CPU lacks", lambda: api.partial_state(backend="nccl").backend)


@probe(AREA, worlds=(1, 2), families=("cpu", "cuda"))
def accelerator_state_properties(api: Api) -> None:
    api.accelerator()
    state = api.get("state.AcceleratorState")()
    _record(api, state, ACCELERATOR_PROPERTIES)
    api.observe("repr", repr, state)
    api.observe("is_initialized", api.get("state.is_initialized"))
    api.observe("print", state.print, "from the state")
    api.observe("wait_for_everyone", state.wait_for_everyone)
    with state.main_process_first():
        pass
    with state.local_main_process_first():
        pass

    def split(inputs, **kwargs):
        with state.split_between_processes(inputs, **kwargs) as share:
            return share

    api.observe("split_between_processes", split, ["a", "b", "c"], apply_padding=True)
    api.observe("get_deepspeed_plugin", state.get_deepspeed_plugin, "default")
    api.observe("select_deepspeed_plugin", state.select_deepspeed_plugin, "default")
    api.observe("an unknown attribute", getattr, state, "no_such_attribute")


@probe(AREA, families=("cpu", "cuda"))
def accelerator_state_construction(api: Api) -> None:
    state_class = api.get("state.AcceleratorState")
    api.observe("is_initialized before", api.get("state.is_initialized"))
    api.observe("without an Accelerator", state_class)
    api.observe("is_initialized after the refusal", api.get("state.is_initialized"))
    api.observe("PartialState after the refusal", lambda: api.get("PartialState")().initialized)
    state_class._reset_state(True)
    api.observe("from an Accelerator's call", lambda: state_class(_from_accelerator=True).mixed_precision)
    api.observe("again, with a precision", state_class, mixed_precision="fp16")
    api.observe("again, with cpu=True", lambda: state_class(cpu=True).initialized)
    api.observe("again, with the same precision", lambda: state_class(mixed_precision="no").initialized)
    state_class._reset_state(True)
    api.observe("an upper-case precision", lambda: state_class(mixed_precision="BF16",
                                                              _from_accelerator=True).mixed_precision)
    state_class._reset_state(True)
    api.observe("an unknown precision", lambda: state_class(mixed_precision="fp32",
                                                           _from_accelerator=True).mixed_precision)
    state_class._reset_state(True)
    api.observe("fp8 without an engine", state_class, mixed_precision="fp8", _from_accelerator=True)


@probe(AREA, env={"ACCELERATE_MIXED_PRECISION": "BF16"})
def accelerator_state_precision_from_the_environment(api: Api) -> None:
    state = api.observe("state", api.get("state.AcceleratorState"), _from_accelerator=True)
    if state is not None:
        api.observe("mixed_precision", getattr, state, "mixed_precision")


@probe(AREA, env={"ACCELERATE_USE_CPU": "1"}, families=("cuda",))
def accelerator_state_cpu_from_the_environment(api: Api) -> None:
    state = api.get("state.AcceleratorState")(_from_accelerator=True)
    api.observe("device", getattr, state, "device")


@probe(AREA)
def accelerator_state_after_a_reset(api: Api) -> None:
    api.accelerator()
    state = api.get("state.AcceleratorState")()
    api.get("state.AcceleratorState")._reset_state()
    api.observe("initialized", getattr, state, "initialized")
    api.observe("a known attribute", getattr, state, "mixed_precision")
    api.observe("another known attribute", getattr, state, "device")
    api.observe("an unknown attribute", getattr, state, "no_such_attribute")
    api.observe("get_deepspeed_plugin", state.get_deepspeed_plugin, "default")
    api.observe("select_deepspeed_plugin", state.select_deepspeed_plugin, "default")
    api.observe("PartialState still initialized", lambda: api.get("PartialState")().initialized)
    api.observe("is_initialized", api.get("state.is_initialized"))
    api.get("state.AcceleratorState")._reset_state(reset_partial_state=True)
    api.observe("PartialState after a full reset", lambda: api.get("PartialState")._shared_state == {})


@probe(AREA)
def gradient_state(api: Api) -> None:
    gradient_state_class = api.get("state.GradientState")
    state = gradient_state_class()
    _record(api, state, GRADIENT_PROPERTIES, "default: ")
    api.observe("repr", repr, state)
    plugin_class = api.get("utils.GradientAccumulationPlugin")
    state = gradient_state_class(plugin_class(num_steps=3, adjust_scheduler=False, sync_with_dataloader=False))
    _record(api, state, ("num_steps", "adjust_scheduler", "sync_with_dataloader", "plugin_kwargs"), "a plugin: ")
    gradient_state_class(plugin_class(num_steps=2))
    _record(api, state, ("num_steps", "sync_with_dataloader", "plugin_kwargs"), "a second plugin: ")
    gradient_state_class()
    _record(api, state, ("num_steps", "plugin_kwargs"), "no plugin afterwards: ")
    api.observe("sync_gradients set", setattr, state, "sync_gradients", False)
    api.observe("sync_gradients after", getattr, gradient_state_class(), "sync_gradients")
    api.observe("is_xla_gradients_synced set", setattr, state, "is_xla_gradients_synced", True)
    api.observe("is_xla_gradients_synced after", getattr, state, "is_xla_gradients_synced")
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    state.is_xla_gradients_synced = False
    api.observe("is_xla_gradients_synced under FSDP", getattr, state, "is_xla_gradients_synced")
    gradient_state_class._reset_state()
    api.observe("initialized after a reset", getattr, state, "initialized")
    api.observe("an attribute after a reset", getattr, state, "sync_gradients")


class _Loader:
    """Stands in for a prepared loader as the gradient state sees one."""

    def __init__(self, end: bool, remainder: int) -> None:
        self.end_of_dataloader = end
        self.remainder = remainder


@probe(AREA)
def gradient_state_dataloaders(api: Api) -> None:
    state = api.get("state.GradientState")()
    outer, inner = _Loader(False, -1), _Loader(True, 3)
    state._add_dataloader(outer)
    state._add_dataloader(inner)
    _record(api, state, ("end_of_dataloader", "remainder", "in_dataloader"), "two loaders: ")
    api.observe("two loaders: references", lambda: [None if loader is None else id(loader) == id(inner)
                                                    for loader in state.dataloader_references])
    state._remove_dataloader(inner)
    _record(api, state, ("end_of_dataloader", "remainder", "in_dataloader"), "inner removed: ")
    api.observe("inner removed: references", lambda: [loader is outer for loader in state.dataloader_references])
    temporary = _Loader(True, 1)
    state._add_dataloader(temporary)
    del temporary
    api.observe("a dropped loader: references", lambda: [loader is outer for loader in state.dataloader_references])
    _record(api, state, ("active_dataloader", "in_dataloader", "end_of_dataloader", "remainder"), "a dropped loader: ")
    state.dataloader_references = [None]
    api.observe("set to [None]", getattr, state, "dataloader_references")


@probe(AREA)
def thread_local_shared_dict(api: Api) -> None:
    shared_class = api.get("state.ThreadLocalSharedDict")

    class Holder:
        store = shared_class()

    first, second = Holder(), Holder()
    api.observe("the initial dict", lambda: first.store)
    first.store["a"] = 1
    api.observe("shared between instances", lambda: second.store)
    api.observe("assigned on an instance", setattr, second, "store", {"b": 2})
    api.observe("seen by the other", lambda: first.store)
    api.observe("thread_local argument", lambda: shared_class(thread_local=True).__get__(None))


def _engine_types(api: Api, accelerator) -> None:
    api.observe("Accelerator.distributed_type", getattr, accelerator, "distributed_type")
    api.observe("AcceleratorState.distributed_type", lambda: api.get("state.AcceleratorState")().distributed_type)
    api.observe("PartialState.distributed_type", lambda: api.get("PartialState")().distributed_type)
    api.observe("is_fsdp2", lambda: accelerator.state.is_fsdp2)
    api.observe("fsdp_plugin version", lambda: accelerator.state.fsdp_plugin.fsdp_version)


@probe(AREA, worlds=(2,), families=("cpu", "cuda"))
def accelerator_state_under_an_fsdp_plugin(api: Api) -> None:
    """FSDP is a distributed type of accelerators: a plugin makes it the state's on GPUs (the PartialState keeps
    MULTI_GPU; CPU ranks keep MULTI_CPU)."""
    plugin = api.get("utils.FullyShardedDataParallelPlugin")(fsdp_version=2)
    _engine_types(api, api.accelerator(fsdp_plugin=plugin))


@probe(AREA, worlds=(2,), families=("cpu", "cuda"), env={"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"})
def accelerator_state_under_a_launchs_fsdp(api: Api) -> None:
    """What ``launch --use_fsdp`` (or a config's FSDP) sets makes the plugin from the environment."""
    _engine_types(api, api.accelerator())
