"""Catalog section "Plugins and engines".

FSDP cases train a small two-block network (`_Net`) on rows of a fixed table
picked by index and compare with one process replaying plain SGD on every
rank's batch of each step (what DDP computes); sharding is measured as the
number of parameter elements each rank holds locally. Engines that are not
installed make their cases NOT_SUPPORTED, naming the package. The DeepSpeed
cases are in `test_plugins_deepspeed`.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable

import torch

from ..engine.case import NotSupported
from ..engine.case import case as _case
from ..support.checks import expect_close, expect_equal, expect_raises, expect_true

#: Building a process group, a device mesh and dynamo's first compile take seconds on a busy machine.
PLUGIN_CASE_TIMEOUT = 60.0
LR = 0.1
BATCH = 2
STEPS = 2
WIDTH = 8
OUT = 4
#: Row i: WIDTH inputs then OUT targets.
_DATA = torch.randn(64, WIDTH + OUT, generator=torch.Generator().manual_seed(4321))


def case(catalog_id: str, **options: Any):
    """`conformance.engine.case.case` with room for process-group and compile start-up."""
    return _case(catalog_id, **{"timeout": PLUGIN_CASE_TIMEOUT, **options})


class Block(torch.nn.Module):
    """A layer class for ``transformer_cls_names_to_wrap``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(WIDTH, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _net() -> _Net:
    torch.manual_seed(0)
    return _Net()


def _loss(model: Any, indices: Any, device: Any = "cpu") -> torch.Tensor:
    rows = _DATA[torch.as_tensor(indices).cpu().long()]
    return torch.nn.functional.mse_loss(model(rows[:, :WIDTH].to(device)), rows[:, WIDTH:].to(device))


def _local_numel(parameter: torch.Tensor) -> int:
    """Elements this rank holds: a DTensor's local shard (FSDP2), else the tensor itself (FSDP1's flat shard)."""
    return (parameter.to_local() if hasattr(parameter, "to_local") else parameter).numel()


def _plain(state: dict) -> dict:
    return {key: value.detach().cpu().float().reshape(-1).tolist() for key, value in state.items()}


def _train(acc: Any, model: Any, optimizer: Any, loader: Any) -> list[list[int]]:
    seen = []
    for batch in loader:
        acc.backward(_loss(model, batch, acc.device))
        optimizer.step()
        optimizer.zero_grad()
        seen.append(batch.tolist())
    return seen


def _fsdp_run(impl: Any, world: Any, **plugin_fields: Any) -> dict:
    """Train `_Net` STEPS steps under an FSDP plugin; report what each rank saw and holds."""
    acc = impl.Accelerator(fsdp_plugin=impl.utils.FullyShardedDataParallelPlugin(**plugin_fields))
    model = _net()
    total = sum(p.numel() for p in model.parameters())
    loader = torch.utils.data.DataLoader(list(range(STEPS * BATCH * world.size)), batch_size=BATCH)
    model = acc.prepare(model)  # model first: FSDP replaces the parameters the optimizer must hold
    optimizer, loader = acc.prepare(torch.optim.SGD(model.parameters(), lr=LR), loader)
    seen = _train(acc, model, optimizer, loader)
    local = sum(_local_numel(p) for p in model.parameters())
    state = acc.get_state_dict(model)
    return {"indices": seen, "local": local, "total": total, "state": _plain(state) if acc.is_main_process else None}


def _replay(values: list[dict]) -> dict:
    """One process, plain SGD, each step on the union of every rank's batch of that step."""
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(len(values[0]["indices"])):
        losses = [_loss(model, v["indices"][step]) for v in values]
        (sum(losses) / len(losses)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return _plain(model.state_dict())


def _close(got: list[float], expected: list[float], what: str, tolerance: float = 1e-6) -> None:
    worst = max(abs(a - b) for a, b in zip(got, expected))
    expect_true(worst <= tolerance, f"{what}: differs by {worst:.3g} (> {tolerance})")


def _check_state(got: dict, expected: dict, what: str, tolerance: float = 1e-5) -> None:
    expect_equal(sorted(got), sorted(expected), f"{what}: state dict keys")
    for key in expected:
        worst = max(abs(a - b) for a, b in zip(got[key], expected[key]))
        expect_true(worst <= tolerance, f"{what}: {key} differs from the DDP result by {worst:.3g} (> {tolerance})")


def _check_sharding(values: list[dict], shards: int, what: str) -> None:
    total = values[0]["total"]
    for rank, v in enumerate(values):
        limit = total / shards * 1.1 + 8
        expect_true(v["local"] <= limit, f"{what}: rank {rank} holds {v['local']} of {total} elements, expected about 1/{shards}")
    if shards == 1:
        expect_equal([v["local"] for v in values], [total] * len(values), f"{what}: elements each rank holds unsharded")


def _check_fsdp_run(values: list[dict], shards: int, what: str) -> None:
    _check_state(values[0]["state"], _replay(values), what)
    _check_sharding(values, shards, what)


@case("plugin.fsdp", worlds=[2])
def plugin_fsdp(impl, world):
    """FSDP shards the model; training matches DDP; `get_state_dict` gives the full unsharded state."""
    return _fsdp_run(impl, world)


@plugin_fsdp.check
def _plugin_fsdp_check(values, world):
    _check_fsdp_run(values, world.size, "FULL_SHARD")


def _strategy_case(strategy: str, worlds: list[str]) -> None:
    """Register a plugin.fsdp_strategies case training under ``strategy``."""

    def function(impl, world):
        return _fsdp_run(impl, world, sharding_strategy=strategy)

    function.__name__ = function.__qualname__ = f"plugin_fsdp_strategy_{strategy.lower()}"
    function.__doc__ = f"sharding_strategy={strategy} trains to the DDP result and holds the expected share."
    registered = case("plugin.fsdp_strategies", worlds=worlds)(function)

    @registered.check
    def _check(values, world):
        shards = {"NO_SHARD": 1, "HYBRID_SHARD": world.ranks_per_machine}.get(strategy, world.size)
        _check_fsdp_run(values, shards, strategy)

    globals()[function.__name__] = registered


for _strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
    _strategy_case(_strategy, ["2", "2x2"])
_strategy_case("HYBRID_SHARD", ["2x2"])


def _fsdp_state_roundtrip(impl: Any, world: Any, state_dict_type: str) -> dict:
    """save_fsdp_model after one step, a second step, load_fsdp_model: the saved weights come back exactly."""
    utils = impl.utils
    plugin = utils.FullyShardedDataParallelPlugin(state_dict_type=state_dict_type)
    acc = impl.Accelerator(fsdp_plugin=plugin)
    model = acc.prepare(_net())
    optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=LR))
    directory = os.path.join(world.shared_dir, state_dict_type.lower())
    steps = [torch.tensor([4 * step + 2 * world.rank, 4 * step + 2 * world.rank + 1]) for step in range(2)]
    _train(acc, model, optimizer, steps[:1])
    utils.save_fsdp_model(plugin, acc, model, directory)
    saved = _plain(acc.get_state_dict(model))
    _train(acc, model, optimizer, steps[1:])
    moved = _plain(acc.get_state_dict(model))
    utils.load_fsdp_model(plugin, acc, model, directory)
    restored = _plain(acc.get_state_dict(model))
    merged = None
    if state_dict_type == "SHARDED_STATE_DICT" and acc.is_main_process:
        from safetensors.torch import load_file

        utils.merge_fsdp_weights(os.path.join(directory, "pytorch_model_fsdp_0"), os.path.join(directory, "merged"))
        merged = _plain(load_file(os.path.join(directory, "merged", "model.safetensors")))
    acc.wait_for_everyone()
    local = sum(_local_numel(p) for p in model.parameters())
    return {"saved": saved, "moved": moved, "restored": restored, "merged": merged, "local": local, "total": 180}


def _check_roundtrip(values: list[dict], world: Any, sharded: bool) -> None:
    main = values[0]
    if main["saved"]:
        expect_true(main["moved"] != main["saved"], "the second step changed the weights")
        expect_equal(main["restored"], main["saved"], "weights after load_fsdp_model (bit-identical to those saved)")
        if sharded:
            expect_equal(main["merged"], main["saved"], "merge_fsdp_weights of the sharded checkpoint")
    _check_sharding(values, world.size, "sharded model")


@case("plugin.fsdp_state_dict", worlds=[2])
def plugin_fsdp_state_dict_sharded(impl, world):
    """SHARDED_STATE_DICT: each rank saves its shard; load restores exactly; merge_fsdp_weights gives the full state."""
    return _fsdp_state_roundtrip(impl, world, "SHARDED_STATE_DICT")


@plugin_fsdp_state_dict_sharded.check
def _sharded_roundtrip_check(values, world):
    _check_roundtrip(values, world, sharded=True)


@case("plugin.fsdp_state_dict", worlds=[2])
def plugin_fsdp_state_dict_full(impl, world):
    """FULL_STATE_DICT: the main process saves the full weights; load restores them exactly on every rank."""
    return _fsdp_state_roundtrip(impl, world, "FULL_STATE_DICT")


@plugin_fsdp_state_dict_full.check
def _full_roundtrip_check(values, world):
    _check_roundtrip(values, world, sharded=False)


def _rank_batch(world: Any, step: int) -> torch.Tensor:
    """This rank's two table rows of ``step`` (the ranks of a step never share a row)."""
    return torch.tensor([4 * step + 2 * world.rank, 4 * step + 2 * world.rank + 1])


#: Files of an Accelerator checkpoint written for FSDP model 0 and optimizer 0, by state_dict_type.
_FSDP_CHECKPOINT_FILES = {
    "FULL_STATE_DICT": ("pytorch_model_fsdp.bin", "optimizer.bin"),
    "SHARDED_STATE_DICT": ("pytorch_model_fsdp_0", "optimizer_0"),
}


def _save_state_resume(acc: Any, model: Any, optimizer: Any, world: Any, directory: str) -> dict:
    """2 steps, save_state into ``directory``, 2 steps (the uninterrupted run), a perturbing step,
    load_state, the same 2 steps again (the resumed run): the full state dict at each of those points."""
    steps = [_rank_batch(world, step) for step in range(5)]
    _train(acc, model, optimizer, steps[:2])
    acc.save_state(directory)
    saved = _plain(acc.get_state_dict(model))
    _train(acc, model, optimizer, steps[2:4])
    uninterrupted = _plain(acc.get_state_dict(model))
    _train(acc, model, optimizer, steps[4:])  # moves the weights and Adam's moments and step count away
    acc.load_state(directory)
    restored = _plain(acc.get_state_dict(model))
    _train(acc, model, optimizer, steps[2:4])
    resumed = _plain(acc.get_state_dict(model))
    return {"saved": saved, "restored": restored, "uninterrupted": uninterrupted, "resumed": resumed}


def _fsdp_save_state_resume(impl: Any, world: Any, state_dict_type: str) -> dict:
    """Adam under FSDP through `_save_state_resume`; a sharded save is also merged with merge_fsdp_weights."""
    acc = impl.Accelerator(fsdp_plugin=impl.utils.FullyShardedDataParallelPlugin(state_dict_type=state_dict_type))
    model = acc.prepare(_net())
    optimizer = acc.prepare(torch.optim.Adam(model.parameters(), lr=0.01))
    directory = os.path.join(world.shared_dir, f"save_state_{state_dict_type.lower()}")
    states = _save_state_resume(acc, model, optimizer, world, directory)
    merged = None
    if state_dict_type == "SHARDED_STATE_DICT" and acc.is_main_process:
        from safetensors.torch import load_file

        target = os.path.join(world.shared_dir, "merged_from_save_state")
        try:  # reported, not raised: the other ranks wait below
            impl.utils.merge_fsdp_weights(os.path.join(directory, "pytorch_model_fsdp_0"), target)
            merged = _plain(load_file(os.path.join(target, "model.safetensors")))
        except Exception as error:  # noqa: BLE001
            merged = f"{type(error).__name__}: {error}"
    acc.wait_for_everyone()
    files = sorted(os.listdir(directory))
    local = sum(_local_numel(p) for p in model.parameters())
    return {**states, "merged": merged, "files": files, "local": local, "total": 180}


def _expect_identical(got: dict, expected: dict, what: str) -> None:
    """Same keys and bit-identical values; a difference is reported by its first key and largest gap."""
    expect_equal(sorted(got), sorted(expected), f"{what}: state dict keys")
    differing = [key for key in expected if got[key] != expected[key]]
    if differing:
        worst = max(abs(a - b) for a, b in zip(got[differing[0]], expected[differing[0]]))
        expect_true(False, f"{what}: {len(differing)} tensors differ, {differing[0]} by up to {worst:.3g}")


def _check_resume(values: list[dict], world: Any, state_dict_type: str) -> None:
    for rank, v in enumerate(values):
        _expect_identical(v["restored"], v["saved"], f"rank {rank}: weights right after load_state (vs those saved)")
        _expect_identical(v["resumed"], v["uninterrupted"], f"rank {rank}: weights 2 steps after load_state (vs the uninterrupted run)")
        for name in _FSDP_CHECKPOINT_FILES[state_dict_type]:
            expect_true(name in v["files"], f"{state_dict_type}: save_state wrote {name} (found {v['files']})")
    if state_dict_type == "SHARDED_STATE_DICT":
        merged = values[0]["merged"]
        expect_true(isinstance(merged, dict), f"merge_fsdp_weights of save_state's sharded model: {merged}")
        _expect_identical(merged, values[0]["saved"], "merge_fsdp_weights of save_state's sharded model")
    _check_sharding(values, world.size, "model after load_state")


def _save_state_case(state_dict_type: str) -> None:
    """Register a plugin.fsdp_state_dict case resuming through ``save_state``/``load_state`` under ``state_dict_type``."""

    def function(impl, world):
        return _fsdp_save_state_resume(impl, world, state_dict_type)

    function.__name__ = function.__qualname__ = f"plugin_fsdp_save_state_{state_dict_type.split('_')[0].lower()}"
    function.__doc__ = f"{state_dict_type}: save_state/load_state restore the sharded model and Adam's state; training resumes bit-identically."
    registered = case("plugin.fsdp_state_dict", worlds=[2])(function)

    @registered.check
    def _check(values, world):
        _check_resume(values, world, state_dict_type)

    globals()[function.__name__] = registered


for _state_dict_type in _FSDP_CHECKPOINT_FILES:
    _save_state_case(_state_dict_type)


def _fsdp_units(model: torch.nn.Module) -> list[str]:
    """Names of the submodules that are FSDP units (FSDP2 ``FSDPModule`` or an FSDP1 wrapper), wrappers stripped."""
    units = []
    for name, module in model.named_modules():
        kinds = {cls.__name__ for cls in type(module).__mro__}
        if name and kinds & {"FSDPModule", "FullyShardedDataParallel"}:
            plain = ".".join(p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module"))
            units.append(plain)
    return units


@case("plugin.fsdp_wrap_policy", worlds=[2])
def plugin_fsdp_wrap_policy(impl, world):
    """Wrap by layer class name (resolved in the model) or by size; an unknown class name is refused naming it."""
    utils = impl.utils
    resolve = impl.part("utils.dataclasses").get_module_class_from_name  # where HF defines it
    expect_equal(resolve(_net(), "Block"), Block, "get_module_class_from_name(model, 'Block')")
    expect_equal(resolve(_net(), "Missing"), None, "get_module_class_from_name of an absent class")
    found = {}
    by_class = {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["Block"]}
    by_size = {"auto_wrap_policy": "size_based_wrap", "min_num_params": 50}
    for label, fields in (("by_class", by_class), ("by_size", by_size)):
        acc = impl.Accelerator(fsdp_plugin=utils.FullyShardedDataParallelPlugin(**fields))
        found[label] = sorted(_fsdp_units(acc.prepare(_net())))
    unknown = utils.FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Nope"])
    acc = impl.Accelerator(fsdp_plugin=unknown)
    error = expect_raises(lambda: acc.prepare(_net()), Exception, "transformer_cls_names_to_wrap=['Nope']")
    expect_true("Nope" in str(error), f"the error names the missing class: {error}")
    return found


@plugin_fsdp_wrap_policy.check
def _wrap_policy_check(values, world):
    for v in values:
        expect_equal(v["by_class"], ["blocks.0", "blocks.1"], "units wrapped by transformer_cls_names_to_wrap=['Block']")
        # torch's size policy wraps the innermost module reaching the size: each block's Linear (72), not the head (36).
        expect_equal(v["by_size"], ["blocks.0.linear", "blocks.1.linear"], "units wrapped by min_num_params=50")


def _require_traceable(acc: Any) -> None:
    """NOT_SUPPORTED where the accelerator's tensors are the simulator's mock-device subclass, which dynamo refuses."""
    on_device = torch.empty(0, device=acc.device)
    if type(on_device) is not torch.Tensor:
        raise NotSupported(
            f"torch.compile cannot trace {acc.device.type} tensors here: they are a {type(on_device).__name__} "
            "tensor subclass (the simulator's mock device), which dynamo's fake tensors refuse"
        )


def _check_compiles(impl: Any, label: str, **accelerator_kwargs: Any) -> None:
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # a graph cached by an earlier case would hide whether this one compiles
    x = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(7))
    acc = impl.Accelerator(**accelerator_kwargs)
    _require_traceable(acc)
    x = x.to(acc.device)
    with torch.no_grad():
        expected = _net().to(acc.device)(x)  # the eager model on the same device: equivalence, not bit equality
    model = acc.prepare(_net())
    expect_true(isinstance(model, OptimizedModule), f"{label}: prepare returns a torch.compile module, got {type(model).__name__}")
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        got = model(x)
    expect_true(counters["stats"]["unique_graphs"] > graphs, f"{label}: the forward ran through a compiled graph")
    expect_close(got, expected, f"{label}: compiled outputs equal the eager model's")
    expect_true(isinstance(acc.unwrap_model(model), OptimizedModule), f"{label}: unwrap_model keeps torch.compile by default")
    bare = acc.unwrap_model(model, keep_torch_compile=False)
    expect_equal(type(bare).__name__, "_Net", f"{label}: unwrap_model(keep_torch_compile=False)")


@case("plugin.dynamo", worlds=[1], imports=("torch._dynamo",))
def plugin_dynamo_backend(impl, world):
    """``dynamo_backend="eager"`` compiles the prepared model; outputs equal eager; unwrap can drop the compile."""
    _check_compiles(impl, "dynamo_backend='eager'", dynamo_backend="eager")


@case("plugin.dynamo", worlds=[1], imports=("torch._dynamo",))
def plugin_dynamo_plugin(impl, world):
    """``TorchDynamoPlugin(backend="aot_eager")`` compiles the prepared model the same way."""
    _check_compiles(impl, "TorchDynamoPlugin(backend='aot_eager')", dynamo_plugin=impl.utils.TorchDynamoPlugin(backend="aot_eager"))


@case("plugin.dynamo", worlds=[1, 2], imports=("torch._dynamo",))
def plugin_dynamo_regional(impl, world):
    """``use_regional_compilation=True`` compiles each repeated block (and the rest) on its own, as HF 1.15.

    The prepared model is no `torch.compile` wrapper: under it (past DDP) the
    user's class holds one compiled module per block and a compiled head;
    outputs and gradients equal the eager model's; ``unwrap_model(...,
    keep_torch_compile=False)`` gives the uncompiled model back.
    """
    from torch._dynamo.eval_frame import OptimizedModule

    torch._dynamo.reset()
    x = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(7))
    plugin = impl.utils.TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    acc = impl.Accelerator(dynamo_plugin=plugin)
    _require_traceable(acc)
    x = x.to(acc.device)
    eager = _net().to(acc.device)  # on the same device: equivalence, not bit equality
    expected = eager(x)
    expected.sum().backward()
    model = acc.prepare(_net())
    expect_true(not isinstance(model, OptimizedModule), "regional compilation does not wrap the whole model")
    inner = getattr(model, "module", model)
    expect_equal(type(inner).__name__, "_Net", "the user's class under the prepared model")
    compiled = sorted(name for name, sub in inner.named_modules() if isinstance(sub, OptimizedModule))
    expect_equal(compiled, ["blocks.0", "blocks.1", "head"], "the modules compiled one by one")
    got = model(x)
    expect_close(got.detach(), expected.detach(), "regionally compiled outputs equal the eager model's")
    acc.backward(got.sum())
    bare = acc.unwrap_model(model, keep_torch_compile=False)
    expect_equal(type(bare).__name__, "_Net", "unwrap_model(keep_torch_compile=False)")
    grads = {name: p.grad for name, p in bare.named_parameters()}  # the compiled modules share these
    for name, p in eager.named_parameters():
        expect_close(grads[name], p.grad, f"gradient of {name} equals the eager model's")
    expect_true(not any(isinstance(sub, OptimizedModule) for sub in bare.modules()), "the unwrapped model has no compiled module")


@case("plugin.dynamo", worlds=[2], imports=("torch._dynamo",))
def plugin_dynamo_regional_fsdp(impl, world):
    """Under FSDP2, regional compilation compiles each block in place (FSDP's hooks still run); training matches DDP."""
    torch._dynamo.reset()
    plugin = impl.utils.TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    acc = impl.Accelerator(fsdp_plugin=impl.utils.FullyShardedDataParallelPlugin(fsdp_version=2), dynamo_plugin=plugin)
    _require_traceable(acc)
    model = _net()
    total = sum(p.numel() for p in model.parameters())
    loader = torch.utils.data.DataLoader(list(range(STEPS * BATCH * world.size)), batch_size=BATCH)
    model = acc.prepare(model)
    compiled = [name for name, sub in model.named_modules() if sub._compiled_call_impl is not None]
    optimizer, loader = acc.prepare(torch.optim.SGD(model.parameters(), lr=LR), loader)
    seen = _train(acc, model, optimizer, loader)
    local = sum(_local_numel(p) for p in model.parameters())
    state = acc.get_state_dict(model)
    return {"indices": seen, "local": local, "total": total, "compiled": compiled,
            "state": _plain(state) if acc.is_main_process else None}


@plugin_dynamo_regional_fsdp.check
def _plugin_dynamo_regional_fsdp_check(values, world):
    for v in values:
        expect_equal(v["compiled"], ["blocks.0", "blocks.1", "head"], "the modules compiled in place, one by one")
    _check_fsdp_run(values, world.size, "FSDP2 with regional compilation")


#: Hook kind -> the name torch gives the registered hook function.
_HOOK_NAMES = {
    "FP16": "fp16_compress_hook",
    "BF16": "bf16_compress_hook",
    "POWER_SGD": "powerSGD_hook",
    "BATCHED_POWER_SGD": "batched_powerSGD_hook",
}
#: comm_state_option per hook: PowerSGD compresses from the second iteration (torch's default waits 1000),
#: without error feedback or warm start. Batched PowerSGD keeps torch's default start: in torch 2.13 its
#: compression step passes a 2-D tensor to ``_orthogonalize``, which asserts 3-D (a torch bug on every
#: backend), so only its registration and its vanilla all-reduce phase are checked.
_HOOK_STATES = {
    "POWER_SGD": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 1, "use_error_feedback": False, "warm_start": False},
    "BATCHED_POWER_SGD": {"matrix_approximation_rank": 1},
}


def _hooked_gradients(impl: Any, world: Any, kind: str) -> dict:
    """Gradients of two backward passes of a DDP model prepared with ``comm_hook=kind``; checks the registration."""
    utils = impl.utils
    options = _HOOK_STATES.get(kind, {})
    handler = utils.DistributedDataParallelKwargs(comm_hook=getattr(utils.DDPCommunicationHookType, kind), comm_state_option=options)
    acc = impl.Accelerator(kwargs_handlers=[handler])
    model = acc.prepare(_net())
    registered = [getattr(h, "__name__", repr(h)) for h, _ in getattr(model, "_comm_hooks", [])]
    expect_equal(registered, [_HOOK_NAMES[kind]] if kind != "NO" else [], f"{kind}: hooks registered on the DDP model")
    for step in range(2):  # PowerSGD compresses from its second iteration
        model.zero_grad()
        acc.backward(_loss(model, [2 * world.rank + step, 2 * world.rank + step + 1], acc.device))
    return {n: p.grad.detach().cpu().reshape(-1).tolist() for n, p in acc.unwrap_model(model).named_parameters()}


@case("plugin.ddp_comm_hook", worlds=[2])
def plugin_ddp_comm_hook(impl, world):
    """FP16 / POWER_SGD / BATCHED_POWER_SGD register torch's hook; gradients stay within the compression's tolerance."""
    return {kind: _hooked_gradients(impl, world, kind) for kind in ("NO", "FP16", "POWER_SGD", "BATCHED_POWER_SGD")}


@case("plugin.ddp_comm_hook", worlds=[2])
def plugin_ddp_comm_hook_bf16(impl, world):
    """BF16 compression: torch allows it only on CUDA 11+ with NCCL 2.10+ (or XPU/XCCL); NOT_SUPPORTED on gloo."""
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    if backend not in ("nccl", "xccl"):
        raise NotSupported(f"torch limit: bf16_compress_hook needs CUDA 11+ and NCCL 2.10+ (or XPU and XCCL), not {backend}")
    return {kind: _hooked_gradients(impl, world, kind) for kind in ("NO", "BF16")}


def _check_compressed(values: list[dict], kind: str, tolerance: float) -> None:
    exact = values[0]["NO"]
    worst = max(abs(a - b) for n in exact for a, b in zip(values[0][kind][n], exact[n]))
    expect_true(0 < worst <= tolerance, f"{kind}: gradients within {tolerance} of plain DDP and compressed (max diff {worst:.3g})")


@plugin_ddp_comm_hook_bf16.check
def _comm_hook_bf16_check(values, world):
    _check_compressed(values, "BF16", 5e-2)


@plugin_ddp_comm_hook.check
def _comm_hook_check(values, world):
    _check_compressed(values, "FP16", 1e-2)
    exact, power = values[0]["NO"], values[0]["POWER_SGD"]
    for name, grad in power.items():
        if name.endswith("bias"):  # PowerSGD all-reduces 1-D tensors uncompressed
            _close(grad, exact[name], f"POWER_SGD: uncompressed gradient of {name}")
    expect_true(any(power[n] != exact[n] for n in exact if n.endswith("weight")), "POWER_SGD: weight gradients are compressed")
    for name, grad in values[0]["BATCHED_POWER_SGD"].items():
        _close(grad, exact[name], f"BATCHED_POWER_SGD before its start iteration: gradient of {name}")
    for v in values[1:]:
        expect_equal(v, values[0], "gradients agree on every rank")


def _refused(build: Callable[[], Any], names: tuple[str, ...], what: str) -> None:
    error = expect_raises(build, Exception, what)
    expect_true(any(n.lower() in str(error).lower() for n in names), f"{what}: the error names {' or '.join(names)}: {error}")


@case("plugin.unavailable_engines", worlds=[1])
def plugin_engine_configs_validate(impl, world):
    """Engine configurations validate as dataclasses, naming the bad field."""
    utils = impl.utils
    _refused(lambda: utils.BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True), ("load_in_8bit",), "8-bit and 4-bit at once")
    _refused(lambda: utils.FP8RecipeKwargs(backend="nonsense"), ("backend",), "an unknown FP8 backend")
    utils.MegatronLMPlugin()  # documented defaults construct
    utils.DeepSpeedPlugin()


#: Engine -> (its import name(s): the case needs all absent, the names an error may use for it, how the case asks for it).
_ENGINE_REQUESTS: dict[str, tuple[Any, tuple[str, ...], Callable[[Any], Any]]] = {
    "deepspeed": ("deepspeed", ("deepspeed",), lambda impl: impl.Accelerator(deepspeed_plugin=impl.utils.DeepSpeedPlugin())),
    "megatron": ("megatron", ("megatron",), lambda impl: impl.Accelerator(megatron_lm_plugin=impl.utils.MegatronLMPlugin())),
    "fp8": (("transformer_engine", "msamp", "torchao"), ("transformer_engine", "transformer-engine", "TransformerEngine"), lambda impl: impl.Accelerator(mixed_precision="fp8")),
    "bnb": (
        "bitsandbytes",
        ("bitsandbytes",),
        lambda impl: impl.utils.load_and_quantize_model(_net(), impl.utils.BnbQuantizationConfig(load_in_8bit=True)),
    ),
}


def _refusal_case(engine: str) -> None:
    """Register a plugin.unavailable_engines case: asking for ``engine`` without its package is refused naming it."""
    modules, names, request = _ENGINE_REQUESTS[engine]
    modules = (modules,) if isinstance(modules, str) else modules
    module = modules[0]

    def function(impl, world):
        installed = [m for m in modules if importlib.util.find_spec(m) is not None]
        if installed:
            raise NotSupported(f"{', '.join(installed)} is installed here, so the absence of {engine}'s engine cannot be checked")
        _refused(lambda: request(impl), names, f"{engine} without {module}")

    function.__name__ = function.__qualname__ = f"plugin_refuses_{engine}"
    function.__doc__ = f"Asking for {engine} without `{module}` installed is refused with an error naming it."
    globals()[function.__name__] = case("plugin.unavailable_engines", worlds=[1])(function)


for _engine in _ENGINE_REQUESTS:
    _refusal_case(_engine)


@case("plugin.unavailable_engines", worlds=[1])
def plugin_bad_sharding_strategy(impl, world):
    """An unknown FSDP sharding strategy is refused naming the field."""
    plugin = impl.utils.FullyShardedDataParallelPlugin
    _refused(lambda: plugin(sharding_strategy="HALF_SHARD"), ("sharding_strategy",), "sharding_strategy='HALF_SHARD'")


@case("plugin.unavailable_engines", worlds=[1])
def plugin_two_engines(impl, world):
    """Two engine plugins at once (where the documents allow one) are refused naming both."""
    utils = impl.utils
    both = {"fsdp_plugin": utils.FullyShardedDataParallelPlugin(), "megatron_lm_plugin": utils.MegatronLMPlugin()}
    error = expect_raises(lambda: impl.Accelerator(**both), Exception, "fsdp_plugin and megatron_lm_plugin together")
    expect_true("fsdp_plugin" in str(error) and "megatron_lm_plugin" in str(error), f"the error names both plugins: {error}")


@case("quantization.load_and_quantize", worlds=[1])
def quantization_load_and_quantize(impl, world):
    """8-bit quantization replaces the Linear layers except skip_modules; outputs stay close; refused without bitsandbytes."""
    utils = impl.utils
    if importlib.util.find_spec("bitsandbytes") is None:
        _refused(
            lambda: utils.load_and_quantize_model(_net(), utils.BnbQuantizationConfig(load_in_8bit=True)),
            ("bitsandbytes",),
            "load_and_quantize_model without bitsandbytes",
        )
        raise NotSupported("the bitsandbytes package is not installed (pip install .[bnb]); refusal checked")
    x = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(7))
    expected = _net()(x)
    config = utils.BnbQuantizationConfig(load_in_8bit=True, skip_modules=["head"], torch_dtype=torch.float32)  # default: fp16
    model = utils.load_and_quantize_model(_net(), config)
    kinds = {name: type(module).__name__ for name, module in model.named_modules() if name in ("blocks.0.linear", "head")}
    expect_equal(kinds, {"blocks.0.linear": "Linear8bitLt", "head": "Linear"}, "layers after 8-bit quantization")
    worst = (model(x).float() - expected).abs().max().item()
    expect_true(worst < 0.1, f"8-bit outputs within 0.1 of the original (max diff {worst:.3g})")
