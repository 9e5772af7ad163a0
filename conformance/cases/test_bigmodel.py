"""Catalog section "Big-model inference": empty init, loading with a device map, dispatch, offload and hooks.

On ``sim`` the devices are the CPU and disk (the execution device is the
CPU); the ``*_npus`` cases need several accelerators (four mock NPUs of
64 MB: ``FOUR_NPUS``) and run on ``sim-npu``, where a hook that forgets to
move an input makes two devices' tensors meet and fail.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import resource
from typing import Iterator

import torch
from safetensors.torch import save_file

from ..engine.case import case
from ..support.checks import expect_equal, expect_raises, expect_tensor, expect_true
from ..support.models import FOUR_NPUS, Net, built, npu_devices, owner_of

IDS = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])


def _empty(impl, **kwargs) -> Net:
    with impl.part("big_modeling").init_empty_weights():
        return Net(**kwargs).eval()


def _save(model: Net, folder: str, layout: str) -> str:
    """Write ``model``'s weights as ``layout`` (safetensors / pickle / sharded / folder); return what to load."""
    os.makedirs(folder, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if layout == "safetensors":
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        return os.path.join(folder, "model.safetensors")
    if layout == "pickle":
        torch.save(state, os.path.join(folder, "pytorch_model.bin"))
        return os.path.join(folder, "pytorch_model.bin")
    names = list(state)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for file, keys in halves.items():
        save_file({k: state[k] for k in keys}, os.path.join(folder, file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
    import json

    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as stream:
        json.dump(index, stream)
    return folder if layout == "folder" else os.path.join(folder, "model.safetensors.index.json")


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _warnings_logged() -> Iterator[list[str]]:
    """The messages any logger records at WARNING or above during the ``with`` (they reach the root's handlers)."""
    handler = _Messages()
    logging.getLogger().addHandler(handler)
    try:
        yield handler.messages
    finally:
        logging.getLogger().removeHandler(handler)


# -- bigmodel.init_empty_weights -------------------------------------------------------


@case("bigmodel.init_empty_weights", worlds=[1])
def init_empty_weights(impl, world):
    """Parameters on ``meta``, a 6.4 GB layer built with no memory; buffers with ``include_buffers``; `init_on_device`."""
    big_modeling = impl.part("big_modeling")
    with big_modeling.init_empty_weights():
        model = Net(width=8, depth=1)  # a first build pays for lazy imports and allocator set-up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with big_modeling.init_empty_weights():
        huge = torch.nn.Sequential(*(torch.nn.Linear(40_000, 40_000) for _ in range(4)))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    expect_true(huge[0].weight.is_meta, "a parameter created inside init_empty_weights is on meta")
    expect_true(grown < 0.01 * 4 * 40_000 * 40_000 * 4, f"building 25.6 GB of weights grew the peak RSS by {grown} bytes")
    expect_true(all(p.is_meta for p in model.parameters()), "every parameter on meta")
    expect_true(not model.blocks[0].shift.is_meta, "buffers stay real without include_buffers")
    with big_modeling.init_empty_weights(include_buffers=True):
        with_buffers = Net(width=8, depth=1)
    expect_true(with_buffers.blocks[0].shift.is_meta, "include_buffers=True puts buffers on meta too")
    with big_modeling.init_on_device(torch.device("cpu")):
        on_cpu = torch.nn.Linear(3, 3)
    expect_equal(on_cpu.weight.device.type, "cpu", "init_on_device('cpu')")
    expect_true(isinstance(on_cpu.weight, torch.nn.Parameter) and on_cpu.weight.requires_grad, "still a Parameter")
    expect_true(not torch.nn.Linear(2, 2).weight.is_meta, "outside the context modules are built normally")


# -- modeling.load_checkpoint_device_map ------------------------------------------------


@case("modeling.load_checkpoint_device_map", worlds=[1])
def load_checkpoint_device_map(impl, world):
    """Every layout (single safetensors/pickle, index, folder) into an empty model with cpu and disk entries."""
    modeling = impl.utils.modeling
    offload = impl.utils.offload
    reference = built(width=8, depth=2)
    device_map = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "head": "cpu"}
    for layout in ("safetensors", "pickle", "index", "folder"):
        checkpoint = _save(reference, os.path.join(world.shared_dir, layout), layout)
        folder = os.path.join(world.shared_dir, f"offload-{layout}")
        model = _empty(impl, width=8, depth=2)
        modeling.load_checkpoint_in_model(model, checkpoint, device_map=device_map, offload_folder=folder, offload_buffers=True)
        for name, tensor in model.state_dict().items():
            if owner_of(name, device_map) == "disk":
                expect_true(tensor.is_meta, f"{layout}: {name} offloaded to disk stays on meta in the model")
            else:
                expect_tensor(tensor, reference.state_dict()[name], f"{layout}: {name} loaded on the cpu")
        loader = offload.OffloadedWeightsLoader(save_folder=folder)
        for name in ("blocks.1.a.weight", "blocks.1.b.bias", "blocks.1.shift"):
            expect_tensor(loader[name], reference.state_dict()[name], f"{layout}: {name} in the offload folder")
    checkpoint = _save(reference, os.path.join(world.shared_dir, "safetensors"), "safetensors")
    model = _empty(impl, width=8, depth=2)
    modeling.load_checkpoint_in_model(
        model, checkpoint, device_map={"": "cpu"}, dtype=torch.float16, keep_in_fp32_modules=["head"], offload_state_dict=True
    )
    expect_equal(model.embed.weight.dtype, torch.float16, "dtype=float16 casts the weights")
    expect_equal(model.head.weight.dtype, torch.float32, "keep_in_fp32_modules keeps head in float32")
    expect_equal(model.blocks[0].count.dtype, torch.int64, "integer buffers keep their dtype")
    expect_tensor(model.head.weight, reference.head.weight, "offload_state_dict: weights are back on the cpu at the end")


# -- bigmodel.dispatch_model --------------------------------------------------------------


@case("bigmodel.dispatch_model", worlds=[1])
def dispatch_cpu_disk(impl, world):
    """A cpu/disk map: outputs equal the plain model's; disk weights are on meta except during their forward."""
    big_modeling = impl.part("big_modeling")
    reference = built(width=8, depth=3)
    expected = reference(IDS)
    model = built(width=8, depth=3)
    device_map = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "head": "cpu"}
    error = expect_raises(lambda: big_modeling.dispatch_model(model, device_map), ValueError,
                          "dispatch_model with disk entries and no offload_dir")
    expect_true("offload_dir" in str(error) and "blocks.1" in str(error),
                f"the refusal names offload_dir and the disk submodules (HF 1.15's words): {error}")
    big_modeling.dispatch_model(model, device_map, offload_dir=os.path.join(world.shared_dir, "offload"))
    expect_equal(model.hf_device_map, device_map, "hf_device_map records the map")
    expect_true(model.blocks[1].a.weight.is_meta, "a disk block's weights are on meta between forwards")
    expect_tensor(model(IDS), expected, "outputs of the dispatched model")
    expect_equal(model.blocks[1].a.seen[0], "cpu", "a disk block's weight is on the execution device during its forward")
    expect_true(model.blocks[2].b.weight.is_meta, "and back on meta after it")


@case("bigmodel.dispatch_model", worlds=[1], device="npu", env=FOUR_NPUS)
def dispatch_across_npus(impl, world):
    """Blocks on four accelerators plus cpu and disk: inputs follow the model; the output comes back on the input's device."""
    devices = npu_devices(4)
    big_modeling = impl.part("big_modeling")
    reference = built(width=8, depth=5)
    expected = reference(IDS)
    model = built(width=8, depth=5)
    device_map = {"embed": 0, "blocks.0": 1, "blocks.1": 2, "blocks.2": 3, "blocks.3": "cpu", "blocks.4": "disk", "head": 3}
    with _warnings_logged() as offloading:
        big_modeling.dispatch_model(model, device_map, offload_dir=os.path.join(world.shared_dir, "offload"))
    expect_equal(len([m for m in offloading if "offloaded to the" in m]), 1,
                 f"one warning names the cpu and disk offload (HF 1.15's 'Some parameters are on the meta device "
                 f"because they were offloaded to the ...'); logged: {offloading}")
    with _warnings_logged() as placing:
        big_modeling.dispatch_model(built(width=8, depth=2), {"embed": 0, "blocks": 1, "head": 2})
    expect_equal(placing, [], "a map of accelerators only warns of nothing (no offload; nor of an old GPU driver here)")
    leaving = []
    for block in model.blocks[:3]:
        block.register_forward_hook(lambda module, args, out: leaving.append(str(out.device)))
    output = model(IDS)
    expect_equal(leaving, devices[1:4], "each block's output stays on its accelerator (only the model's goes back)")
    expect_equal(str(output.device), "cpu", "the output is on the input's device")
    expect_tensor(output, expected, "outputs across four accelerators, cpu and disk")
    for index, block in enumerate(model.blocks[:3]):
        expect_equal(block.a.seen, (devices[index + 1], devices[index + 1]), f"blocks.{index} ran on its accelerator with its input there")
    expect_equal(model.blocks[3].a.seen, (devices[0], devices[0]), "a cpu block runs on accelerator 0 (the main device)")


@case("bigmodel.dispatch_model", worlds=[1], device="npu", env=FOUR_NPUS)
def dispatch_tied_offloaded(impl, world):
    """Tied weights offloaded to the CPU come to the main accelerator for each forward and leave no copy there after it."""
    devices = npu_devices(2)
    big_modeling = impl.part("big_modeling")
    expected = built(width=8, depth=2, tie=True)(IDS)
    model = built(width=8, depth=2, tie=True)
    big_modeling.dispatch_model(model, {"embed": "cpu", "blocks": 1, "head": "cpu"}, main_device=0)
    gc.collect()  # what earlier cases left in reference cycles is freed now, not during the forward measured below
    at_rest = torch.npu.memory_allocated(0)
    with torch.no_grad():  # no autograd graph holding the forward's tensors
        output = model(IDS)
        expect_tensor(output.cpu(), expected, "outputs of the dispatched tied model")
        expect_equal(model.head.seen, (devices[0], devices[0]), "the tied head runs on the main accelerator")
        expect_equal(torch.npu.memory_allocated(0) - at_rest, 0,
                     f"bytes left on {devices[0]} after a forward (a copy of the offloaded tied weight kept)")
        model(IDS)
        expect_equal(torch.npu.memory_allocated(0) - at_rest, 0, f"bytes left on {devices[0]} after a second forward")


# -- prepare.verify_device_map, with a real dispatch ----------------------------------------


def _prepare_dispatched(impl, world, device_map: dict) -> None:
    """Dispatch with ``device_map``, then ``prepare``: each block still runs where the map put it, outputs unchanged.

    An implementation whose ``distributed_type`` is not ``NO`` here must
    refuse instead, with an error naming the device map.
    """
    big_modeling = impl.part("big_modeling")
    expected = built(width=8, depth=4)(IDS)
    model = built(width=8, depth=4)
    big_modeling.dispatch_model(model, device_map, offload_dir=os.path.join(world.shared_dir, "offload-prepare"))
    model(IDS)
    placed = [block.a.seen for block in model.blocks]
    accelerator = impl.Accelerator()
    expect_true(accelerator.verify_device_map(model), f"verify_device_map(model dispatched with {device_map})")
    if str(accelerator.distributed_type).split(".")[-1] != "NO":
        # One process started the torchrun way counts as distributed for some implementations (HF 1.15:
        # MULTI_CPU); they refuse as at several processes, which the catalog row allows.
        error = expect_raises(lambda: accelerator.prepare(model), ValueError, "prepare(dispatched model) in a distributed mode")
        expect_true("device_map" in str(error) or "device map" in str(error), f"the error should name the device map: {error}")
        return
    try:
        prepared = accelerator.prepare(model)
    except NotImplementedError as error:  # torch's, from moving meta (offloaded) weights: a bug, not a missing feature
        raise AssertionError(f"prepare(dispatched model) at one process raised NotImplementedError: {error}") from error
    expect_true(accelerator.unwrap_model(prepared) is model, "prepare at one process returns the dispatched model itself")
    expect_true(model.blocks[3].a.weight.is_meta, "a disk block's weights stay on meta after prepare")
    expect_tensor(prepared(IDS).cpu(), expected, "outputs of the prepared dispatched model")
    for index, block in enumerate(model.blocks):
        expect_equal(block.a.seen, placed[index], f"blocks.{index} runs where the device map put it after prepare")


@case("prepare.verify_device_map", worlds=[1])
def prepare_keeps_cpu_disk_map(impl, world):
    """At one process ``prepare`` keeps a cpu/disk-dispatched model as it is: disk weights stay offloaded."""
    _prepare_dispatched(impl, world, {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "cpu", "blocks.2": "cpu", "blocks.3": "disk", "head": "cpu"})


@case("prepare.verify_device_map", worlds=[1], device="npu", env=FOUR_NPUS)
def prepare_keeps_npu_map(impl, world):
    """At one process ``prepare`` moves no block of a model spread over four accelerators to the main device."""
    npu_devices(4)
    _prepare_dispatched(impl, world, {"embed": 0, "blocks.0": 1, "blocks.1": 2, "blocks.2": 3, "blocks.3": "disk", "head": 3})


# -- bigmodel.load_checkpoint_and_dispatch ----------------------------------------------------


def _load_and_dispatch(impl, world, strategy: str, budget: dict, label: str):
    big_modeling = impl.part("big_modeling")
    reference = built(width=16, depth=6)
    checkpoint = _save(reference, os.path.join(world.shared_dir, f"ckpt-{label}"), "folder")
    model = _empty(impl, width=16, depth=6)
    model = big_modeling.load_checkpoint_and_dispatch(
        model, checkpoint, device_map=strategy, max_memory=dict(budget), no_split_module_classes=["Block"],
        offload_folder=os.path.join(world.shared_dir, f"offload-{label}"),
    )
    expect_tensor(model(IDS), reference(IDS), f"{strategy}: outputs equal the fully loaded model's")
    for key in model.hf_device_map:
        expect_true(not any(key.startswith(f"blocks.{i}.") for i in range(6)), f"{strategy}: a Block kept whole ({key})")
    return model


@case("bigmodel.load_checkpoint_and_dispatch", worlds=[1])
def load_and_dispatch_cpu_disk(impl, world):
    """Empty init, then each strategy with a CPU budget that forces disk offload; outputs equal the loaded model's."""
    block = 16 * 16 * 4 * 2 + 16 * 4 * 2 + 16 * 4 + 16 * 8
    for strategy in ("sequential", "auto", "balanced"):
        model = _load_and_dispatch(impl, world, strategy, {"cpu": 3 * block}, strategy)
        expect_true("disk" in model.hf_device_map.values(), f"{strategy}: a CPU budget of 3 blocks sends some to disk")


@case("bigmodel.load_checkpoint_and_dispatch", worlds=[1], device="npu", env=FOUR_NPUS)
def load_and_dispatch_npus(impl, world):
    """Over four accelerators: each holds no more than its budget (memory_allocated), outputs equal the loaded model's;
    ``balanced_low_0`` keeps accelerator 0 (where generation's outputs go) lighter than ``balanced`` does."""
    npu_devices(4)
    block = 16 * 16 * 4 * 2 + 16 * 4 * 2 + 16 * 4 + 16 * 8
    budget = {0: 2 * block, 1: 2 * block, 2: 2 * block, 3: 2 * block, "cpu": 10**7}
    on_first = {}
    for strategy in ("sequential", "balanced", "balanced_low_0", "auto"):
        gc.collect()
        before = [torch.npu.memory_allocated(index) for index in range(4)]  # what earlier cases left
        model = _load_and_dispatch(impl, world, strategy, budget, strategy)
        used = {d for d in model.hf_device_map.values()}
        expect_true(len(used & {0, 1, 2, 3}) >= 2, f"{strategy}: several accelerators used: {model.hf_device_map}")
        for index in range(4):
            held = torch.npu.memory_allocated(index) - before[index]
            expect_true(held <= budget[index], f"{strategy}: npu:{index} holds {held} bytes, budget {budget[index]}")
        on_first[strategy] = [key for key, device in model.hf_device_map.items() if device == 0]
        del model  # freed before the next strategy loads
        gc.collect()
    expect_true(len(on_first["balanced_low_0"]) < len(on_first["balanced"]),
                f"balanced_low_0 puts less on accelerator 0 than balanced: {on_first['balanced_low_0']} "
                f"against {on_first['balanced']}")


# -- bigmodel.cpu_offload --------------------------------------------------------------------


@case("bigmodel.cpu_offload", worlds=[1])
def cpu_and_disk_offload(impl, world):
    """`cpu_offload` / `disk_offload`: weights stay off the module (meta) except during its forward; outputs equal."""
    big_modeling = impl.part("big_modeling")
    expected = built(width=8, depth=2)(IDS)
    model = big_modeling.cpu_offload(built(width=8, depth=2), execution_device="cpu")
    expect_true(model.blocks[0].a.weight.is_meta, "cpu_offload: weights on meta between forwards")
    expect_tensor(model(IDS), expected, "cpu_offload: outputs")
    expect_equal(model.blocks[0].a.seen[0], "cpu", "the weight is on the execution device during the forward")
    _expect_offloaded(model, "cpu_offload: after a forward")
    expect_tensor(model(IDS), expected, "cpu_offload: outputs of a second forward (the weights come back from the CPU copy)")
    impl.part("hooks").remove_hook_from_module(model, recurse=True)
    on_meta = [name for name, param in model.named_parameters() if param.is_meta]
    expect_equal(on_meta, [], "remove_hook_from_module(recurse=True) puts the offloaded weights back on the module (these stayed on meta)")
    expect_tensor(model(IDS), expected, "outputs once the hooks are removed")
    folder = os.path.join(world.shared_dir, "disk")
    model = big_modeling.disk_offload(built(width=8, depth=2), folder, execution_device="cpu")
    expect_true(os.path.isfile(os.path.join(folder, "index.json")), "disk_offload writes index.json")
    expect_true(os.path.isfile(os.path.join(folder, "blocks.0.a.weight.dat")), "and one .dat per weight")
    expect_tensor(model(IDS), expected, "disk_offload: outputs")
    expect_true(model.head.weight.is_meta, "disk_offload: weights on meta between forwards")


@case("bigmodel.cpu_offload", worlds=[1], device="npu", env=FOUR_NPUS)
def cpu_offload_to_npu(impl, world):
    """Executing on an accelerator: each submodule's weights come to it for the forward only."""
    devices = npu_devices(1)
    big_modeling = impl.part("big_modeling")
    expected = built(width=8, depth=2)(IDS)
    model = big_modeling.cpu_offload(built(width=8, depth=2), execution_device=devices[0])
    output = model(IDS)
    expect_equal(model.blocks[1].b.seen, (devices[0], devices[0]), "weight and input on the accelerator during the forward")
    expect_tensor(output.cpu(), expected, "outputs")
    _expect_offloaded(model, "cpu_offload to an accelerator: after a forward")


def _expect_offloaded(model: torch.nn.Module, when: str) -> None:
    """Every parameter of ``model`` is on meta (its weights are kept off the module between forwards)."""
    kept = [name for name, param in model.named_parameters() if not param.is_meta]
    expect_equal(kept, [], f"{when}, every weight is back on meta (these stayed on the execution device)")


# -- bigmodel.cpu_offload_with_hook ------------------------------------------------------------


@case("bigmodel.cpu_offload_with_hook", worlds=[1])
def offload_with_hook_chain(impl, world):
    """Two chained models run with the plain outputs; ``offload()`` leaves the model on the cpu; ``remove()`` drops the hook.

    On the CPU alone a model offloaded "to the cpu" does not move, so the
    chain's offloading is checked by the ``_npu`` variant.
    """
    big_modeling = impl.part("big_modeling")
    first, second = built(width=8, depth=1), built(seed=1, width=8, depth=1)
    expected = second(first(IDS).argmax(-1))
    first, first_hook = big_modeling.cpu_offload_with_hook(first, "cpu")
    second, second_hook = big_modeling.cpu_offload_with_hook(second, "cpu", prev_module_hook=first_hook)
    expect_tensor(second(first(IDS).argmax(-1)), expected, "outputs through the chain")
    second_hook.offload()
    expect_equal(second.head.weight.device.type, "cpu", "hook.offload() puts the model on the cpu")
    second_hook.remove()
    expect_true(not hasattr(second, "_hf_hook"), "hook.remove() takes the hook off the model")
    expect_tensor(second(first(IDS).argmax(-1)), expected, "the model runs without its hook")


@case("bigmodel.cpu_offload_with_hook", worlds=[1], device="npu", env=FOUR_NPUS)
def offload_with_hook_npu(impl, world):
    """On an accelerator: the model moves there at its forward and back on ``offload()``; the chain keeps one there."""
    devices = npu_devices(1)
    big_modeling = impl.part("big_modeling")
    first, first_hook = big_modeling.cpu_offload_with_hook(built(width=8, depth=1), devices[0])
    second, _ = big_modeling.cpu_offload_with_hook(built(seed=1, width=8, depth=1), devices[0], prev_module_hook=first_hook)
    first(IDS)
    expect_equal(str(first.head.weight.device), devices[0], "the first model is on the accelerator after its forward")
    second(IDS)
    expect_equal(str(first.head.weight.device), "cpu", "running the second model sent the first back to the cpu")
    expect_equal(str(second.head.weight.device), devices[0], "the second model is on the accelerator")


# -- hooks.add_remove --------------------------------------------------------------------------


@case("hooks.add_remove", worlds=[1])
def hooks_add_remove(impl, world):
    """pre_forward/post_forward around forward; ``append=True`` chains in order; removal restores the forward."""
    hooks = impl.part("hooks")

    class AddToInput(hooks.ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            return (args[0] + 1,) + args[1:], kwargs

    class Double(hooks.ModelHook):
        def post_forward(self, module, output):
            return output * 2

    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    plain = layer(x)
    hooks.add_hook_to_module(layer, AddToInput())
    expect_tensor(layer(x), layer._old_forward(x + 1), "pre_forward changes the input")
    hooks.add_hook_to_module(layer, Double(), append=True)
    expect_true(isinstance(layer._hf_hook, hooks.SequentialHook), "append=True makes a SequentialHook")
    expect_tensor(layer(x), 2 * layer._old_forward(x + 1), "both hooks run, in order")
    hooks.add_hook_to_module(layer, Double())
    expect_tensor(layer(x), 2 * plain, "without append the new hook replaces the old ones")
    hooks.remove_hook_from_module(layer)
    expect_tensor(layer(x), plain, "remove_hook_from_module restores the original forward")
    expect_true(not hasattr(layer, "_hf_hook"), "no hook left")
    outer = torch.nn.Sequential(torch.nn.Linear(3, 3))
    hooks.add_hook_to_module(outer[0], Double())
    hooks.add_hook_to_module(outer, Double())
    before = outer[0]._old_forward(x)
    hooks.remove_hook_from_module(outer, recurse=True)
    expect_tensor(outer(x), before, "recurse=True removes the submodules' hooks too")


def _return_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``), so that memory an earlier step
    freed but kept resident does not absorb what ``function`` allocates: glibc raises its mmap threshold after a
    large free, and later allocations of that size reuse the resident heap without growing the RSS."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)


def _peak_rss_growth(function) -> int:
    """Run ``function`` while sampling this process's resident memory; return the peak above the start, in bytes."""
    import threading

    import psutil

    process = psutil.Process()
    _return_free_heap()
    start = process.memory_info().rss
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        function()
    finally:
        done.set()
        sampler.join(timeout=10)
    return peak[0] - start


@case("bigmodel.load_checkpoint_and_dispatch", worlds=[1], timeout=120)
def load_within_cpu_budget(impl, world):
    """A 100 MB sharded checkpoint loaded with a 16 MB CPU budget (the rest to disk) never holds the checkpoint in RAM.

    The process's resident memory may grow by the CPU budget plus a few
    layers (one shard is read at a time), not by the checkpoint's size.
    """
    big_modeling = impl.part("big_modeling")
    width, depth = 1024, 12
    layer = width * width * 4
    folder = os.path.join(world.shared_dir, "big")
    os.makedirs(folder)
    reference = built(width=width, depth=depth)
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    shards = {f"blocks.{i}": f"model-{i + 1:05d}-of-{depth + 1:05d}.safetensors" for i in range(depth)}
    weight_map = {name: shards.get(".".join(name.split(".")[:2]), f"model-{depth + 1:05d}-of-{depth + 1:05d}.safetensors") for name in state}
    for file in dict.fromkeys(weight_map.values()):
        save_file({k: state[k] for k, f in weight_map.items() if f == file}, os.path.join(folder, file), metadata={"format": "pt"})
    import json

    with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as stream:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, stream)
    expected_embed = reference.embed.weight.detach().clone()
    del reference, state
    gc.collect()
    model = _empty(impl, width=width, depth=depth)
    cpu_budget = 4 * layer
    loaded = []

    def load() -> None:
        loaded.append(
            big_modeling.load_checkpoint_and_dispatch(
                model, folder, device_map="sequential", max_memory={"cpu": cpu_budget},
                no_split_module_classes=["Block"], offload_folder=os.path.join(world.shared_dir, "big-offload"),
            )
        )

    grown = _peak_rss_growth(load)
    total = depth * 2 * layer
    expect_true("disk" in loaded[0].hf_device_map.values(), f"a 16 MB CPU budget sends blocks to disk: {loaded[0].hf_device_map}")
    expect_true(
        grown <= cpu_budget + 4 * layer,
        f"loading a {total >> 20} MB checkpoint with a {cpu_budget >> 20} MB CPU budget grew the resident memory by {grown >> 20} MB",
    )
    expect_tensor(loaded[0].embed.weight, expected_embed, "the embedding (on the cpu) is loaded")
