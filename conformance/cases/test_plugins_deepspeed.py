"""Catalog section "Plugins and engines": DeepSpeed through the real ``deepspeed`` package.

The ZeRO cases train `test_plugins`' small network at world 2 on DeepSpeed's
CPU accelerator over gloo and compare with one process replaying the same
steps (plain SGD, or torch AdamW where DeepSpeed's optimizer is AdamW); the
checkpoint case resumes bit-identically. Where the deepspeed package is
absent they are NOT_SUPPORTED, naming it. DeepSpeed's first use on a
machine JIT-compiles its communication op (and, with optimizer offload,
its CPU Adam): minutes, cached after in ``~/.cache/torch_extensions``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import torch

from ..engine.case import NotSupported
from ..support.checks import expect_equal, expect_raises, expect_true
from .test_plugins import (
    _DATA,
    BATCH,
    LR,
    STEPS,
    WIDTH,
    _check_state,
    _close,
    _expect_identical,
    _loss,
    _Net,
    _net,
    _plain,
    _rank_batch,
    _replay,
    _save_state_resume,
    _train,
    case,
)

#: DeepSpeed's first use on a machine JIT-compiles its CPU ops (minutes; cached after).
DEEPSPEED_CASE_TIMEOUT = 300.0
#: What the DeepSpeed cases import on first use: seconds per rank (it imports mlflow for its autotuner).
DEEPSPEED_IMPORTS = ("deepspeed",)


def _require_deepspeed() -> None:
    """NOT_SUPPORTED, naming the package, where deepspeed is not installed, and naming DeepSpeed's limit on an XLA
    machine: DeepSpeed has no accelerator for XLA devices (``SUPPORTED_ACCELERATOR_LIST`` of
    deepspeed/accelerator/real_accelerator.py: cuda, cpu, xpu, npu, mps, hpu, mlu and others, no xla), so on a TPU
    it would partition onto the host while the model sits on the XLA device; and on an NPU machine without Huawei's
    CANN toolkit, which DeepSpeed's NPU accelerator builds every op with (a mock NPU machine has none)."""
    if importlib.util.find_spec("deepspeed") is None:
        raise NotSupported("the deepspeed package is not installed (pip install .[deepspeed])")
    if importlib.util.find_spec("torch_xla") is not None:
        raise NotSupported("deepspeed limit: DeepSpeed has no accelerator for XLA devices (deepspeed/accelerator/real_accelerator.py)")
    if importlib.util.find_spec("torch_npu") is not None and "ASCEND_HOME_PATH" not in os.environ:
        raise NotSupported("deepspeed limit: DeepSpeed's NPU accelerator builds its ops with Huawei's CANN toolkit "
                           "($ASCEND_HOME_PATH, deepspeed/ops/op_builder/npu/builder.py), which this machine lacks")


def _deepspeed_config(**overrides: Any) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": "auto"},
    }
    return {**config, **overrides}


@case("plugin.deepspeed_config", worlds=[1], imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_config(impl, world):
    """DeepSpeedPlugin fills "auto" from its fields and from `deepspeed_config_process`; refuses contradictions by key."""
    plugin_class = impl.utils.DeepSpeedPlugin
    plugin = plugin_class(hf_ds_config=_deepspeed_config(), zero_stage=2, gradient_accumulation_steps=4)
    config = plugin.deepspeed_config
    expect_equal(config["zero_optimization"]["stage"], 2, "zero_optimization.stage filled from zero_stage")
    expect_equal(config["gradient_accumulation_steps"], 4, "gradient_accumulation_steps filled from the plugin")
    plugin.deepspeed_config_process(must_match=True, train_micro_batch_size_per_gpu=8)
    expect_equal(config["train_micro_batch_size_per_gpu"], 8, "train_micro_batch_size_per_gpu filled by deepspeed_config_process")
    fixed = plugin_class(hf_ds_config=_deepspeed_config(train_micro_batch_size_per_gpu=8), zero_stage=2, gradient_accumulation_steps=1)
    error = expect_raises(
        lambda: fixed.deepspeed_config_process(must_match=True, train_micro_batch_size_per_gpu=16),
        ValueError,
        "a config value contradicting the given value",
    )
    expect_true("train_micro_batch_size_per_gpu" in str(error), f"the refusal names the key: {error}")
    path = os.path.join(world.shared_dir, "broken_ds_config.json")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"zero_optimization": ')
    expect_raises(lambda: plugin_class(hf_ds_config=path), ValueError, "a DeepSpeed config file that does not parse")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(_deepspeed_config(), handle)
    from_file = plugin_class(hf_ds_config=path, zero_stage=3, gradient_accumulation_steps=1)
    expect_equal(from_file.deepspeed_config["zero_optimization"]["stage"], 3, "stage filled from zero_stage (config read from a file)")


@case("plugin.deepspeed_config", worlds=[1], imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_config_contradiction(impl, world):
    """A plugin field contradicting a set config value is refused at construction, naming the key."""
    config = _deepspeed_config(zero_optimization={"stage": 3})
    error = expect_raises(
        lambda: impl.utils.DeepSpeedPlugin(hf_ds_config=config, zero_stage=2), ValueError, "zero_stage=2 against stage 3 in the config"
    )
    expect_true("zero_optimization.stage" in str(error), f"the refusal names the key: {error}")


def _zero_plugin(impl: Any, stage: int, accumulation: int) -> Any:
    """DeepSpeed clips gradients at norm 1.0 unless told otherwise: off here, to compare with plain DDP."""
    config = _deepspeed_config(train_batch_size="auto", gradient_clipping=0.0)
    return impl.utils.DeepSpeedPlugin(hf_ds_config=config, zero_stage=stage, gradient_accumulation_steps=accumulation)


def _zero_run(impl: Any, world: Any, stage: int, accumulation: int) -> dict:
    """Train `_Net` under ZeRO ``stage``: STEPS optimizer steps of ``accumulation`` batches each, through `accumulate`."""
    _require_deepspeed()
    acc = impl.Accelerator(deepspeed_plugin=_zero_plugin(impl, stage, accumulation), gradient_accumulation_steps=accumulation)
    loader = torch.utils.data.DataLoader(list(range(STEPS * accumulation * BATCH * world.size)), batch_size=BATCH)
    model = _net()
    model, optimizer, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR), loader)
    cycles: list[list[int]] = []
    for number, batch in enumerate(loader):
        with acc.accumulate(model):
            acc.backward(_loss(model, batch, acc.device))
            optimizer.step()
            optimizer.zero_grad()
        if number % accumulation == 0:
            cycles.append([])
        cycles[-1].extend(batch.tolist())  # one step's rows: the MSE over them is the mean of its batches' losses
    state = acc.get_state_dict(model)
    return {"indices": cycles, "state": _plain(state) if acc.is_main_process else None, "types": [type(model).__name__, type(optimizer).__name__]}


def _check_zero(values: list[dict], label: str) -> None:
    expect_equal(values[0]["types"][0], "DeepSpeedEngine", f"{label}: prepare returns DeepSpeed's engine for the model")
    _check_state(values[0]["state"], _replay(values), label, tolerance=1e-5)


@case("plugin.deepspeed_zero", worlds=[2], timeout=DEEPSPEED_CASE_TIMEOUT, imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_zero(impl, world):
    """ZeRO 1/2/3 through the deepspeed package train to the DDP result; NOT_SUPPORTED naming it where absent."""
    return {stage: _zero_run(impl, world, stage, accumulation=1) for stage in (1, 2, 3)}


@plugin_deepspeed_zero.check
def _deepspeed_zero_check(values, world):
    for stage in (1, 2, 3):
        _check_zero([v[stage] for v in values], f"ZeRO stage {stage}")


@case("plugin.deepspeed_zero", worlds=[2], timeout=DEEPSPEED_CASE_TIMEOUT, imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_accumulation(impl, world):
    """ZeRO stage 2 with gradient_accumulation_steps=2: `accumulate` + `backward` step once per two batches, as DDP."""
    return _zero_run(impl, world, 2, accumulation=2)


@plugin_deepspeed_accumulation.check
def _deepspeed_accumulation_check(values, world):
    _check_zero(values, "ZeRO stage 2, 2 accumulation steps")


def _deepspeed_resume(impl: Any, world: Any, stage: int) -> dict:
    """Adam under ZeRO ``stage`` through `_save_state_resume`."""
    _require_deepspeed()
    config = _deepspeed_config(train_micro_batch_size_per_gpu=BATCH, gradient_clipping=0.0)
    acc = impl.Accelerator(deepspeed_plugin=impl.utils.DeepSpeedPlugin(hf_ds_config=config, zero_stage=stage))
    model = _net()
    model, optimizer = acc.prepare(model, torch.optim.Adam(model.parameters(), lr=0.01))
    directory = os.path.join(world.shared_dir, f"deepspeed_save_state_zero{stage}")
    states = _save_state_resume(acc, model, optimizer, world, directory)
    acc.wait_for_everyone()
    return {**states, "files": sorted(os.listdir(directory)), "type": type(model).__name__}


def _check_deepspeed_resume(values: list[dict], stage: int) -> None:
    label = f"ZeRO stage {stage}"
    expect_equal(values[0]["type"], "DeepSpeedEngine", f"{label}: prepare returns DeepSpeed's engine for the model")
    files = values[0]["files"]
    expect_true("pytorch_model" in files, f"{label}: save_state wrote the engine's own checkpoint folder pytorch_model/ (found {files})")
    for name in ("model.safetensors", "optimizer.bin"):
        expect_true(name not in files, f"{label}: the engine's checkpoint holds the model and optimizer, not {name} (found {files})")
    for rank, v in enumerate(values):
        _expect_identical(v["restored"], v["saved"], f"{label}, rank {rank}: weights right after load_state (vs those saved)")
        _expect_identical(v["resumed"], v["uninterrupted"], f"{label}, rank {rank}: weights 2 steps after load_state (vs the uninterrupted run)")


@case("plugin.deepspeed_zero", worlds=[2], timeout=DEEPSPEED_CASE_TIMEOUT, imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_save_state(impl, world):
    """ZeRO 2 and 3: save_state/load_state go through the engine's own checkpointing; training resumes bit-identically."""
    return {stage: _deepspeed_resume(impl, world, stage) for stage in (2, 3)}


@plugin_deepspeed_save_state.check
def _deepspeed_save_state_check(values, world):
    for stage in (2, 3):
        _check_deepspeed_resume([v[stage] for v in values], stage)


#: The optimizer and scheduler sections of a DeepSpeed config, their "auto" values for the dummies to fill.
_CONFIG_OPTIMIZER = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}
_CONFIG_SCHEDULER = {
    "type": "WarmupLR",
    "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "warmup_type": "linear"},
}
DUMMY_LR = 0.05
DUMMY_WEIGHT_DECAY = 0.1
DUMMY_STEPS = 5


def _dummy_plugin(impl: Any, **sections: Any) -> Any:
    config = _deepspeed_config(train_micro_batch_size_per_gpu=BATCH, gradient_clipping=0.0, **sections)
    return impl.utils.DeepSpeedPlugin(hf_ds_config=config, zero_stage=2)


def _dummy_run(impl: Any, world: Any) -> dict:
    """AdamW and WarmupLR from the config through DummyOptim/DummyScheduler; the learning rate each step used."""
    _require_deepspeed()
    utils = impl.utils
    model = _net()
    refusals = {}
    for label, sections, optimizer in (
        ("torch optimizer with an optimizer section", {"optimizer": _CONFIG_OPTIMIZER}, torch.optim.SGD(model.parameters(), lr=LR)),
        ("DummyOptim without an optimizer section", {}, utils.DummyOptim(model.parameters(), lr=DUMMY_LR)),
    ):
        acc = impl.Accelerator(deepspeed_plugin=_dummy_plugin(impl, **sections))
        try:
            acc.prepare(model, optimizer)
            refusals[label] = None
        except ValueError as error:
            refusals[label] = str(error)
    acc = impl.Accelerator(deepspeed_plugin=_dummy_plugin(impl, optimizer=_CONFIG_OPTIMIZER, scheduler=_CONFIG_SCHEDULER))
    optimizer = utils.DummyOptim(model.parameters(), lr=DUMMY_LR, weight_decay=DUMMY_WEIGHT_DECAY)
    model, optimizer, scheduler = acc.prepare(model, optimizer, utils.DummyScheduler(optimizer, warmup_num_steps=2))
    rates, seen = [], []
    for step in range(DUMMY_STEPS):
        rates.append(optimizer.optimizer.param_groups[0]["lr"])
        batch = _rank_batch(world, step)
        acc.backward(_loss(model, batch))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        seen.append(batch.tolist())
    state = acc.get_state_dict(model)
    return {"refusals": refusals, "rates": rates, "indices": seen, "state": _plain(state) if acc.is_main_process else None,
            "types": [type(optimizer).__name__, type(scheduler).__name__],
            "active": impl.utils.get_active_deepspeed_plugin(acc.state) is acc.deepspeed_plugin}


def _warmup_rates() -> list[float]:
    """The learning rate of each step under deepspeed's own WarmupLR of `_CONFIG_SCHEDULER`, stepped once per step."""
    from deepspeed.runtime.lr_schedules import WarmupLR

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=DUMMY_LR)
    schedule = WarmupLR(probe, warmup_min_lr=0, warmup_max_lr=DUMMY_LR, warmup_num_steps=2, warmup_type="linear")
    rates = []
    for _ in range(DUMMY_STEPS):
        rates.append(probe.param_groups[0]["lr"])
        schedule.step()
    return rates


def _replay_adamw(values: list[dict], rates: list[float]) -> dict:
    """One process, torch AdamW at each step's learning rate, on the union of every rank's batch of that step."""
    model = _net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=DUMMY_LR, weight_decay=DUMMY_WEIGHT_DECAY)
    for step, rate in enumerate(rates):
        optimizer.param_groups[0]["lr"] = rate
        losses = [_loss(model, v["indices"][step]) for v in values]
        (sum(losses) / len(losses)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return _plain(model.state_dict())


@case("plugin.deepspeed_config", worlds=[2], timeout=DEEPSPEED_CASE_TIMEOUT, imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_dummy_optim(impl, world):
    """The config's optimizer and scheduler through DummyOptim/DummyScheduler: "auto" filled from them, the engine
    steps both; an optimizer given both in the config and in code, or a DummyOptim without a config section, is refused."""
    return _dummy_run(impl, world)


@plugin_deepspeed_dummy_optim.check
def _dummy_optim_check(values, world):
    v = values[0]
    for label, error in v["refusals"].items():
        expect_true(error is not None and "optimizer" in error, f"{label}: refused with an error naming the optimizer ({error})")
    expect_equal(v["types"], ["DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper"], "prepare returns DeepSpeed's optimizer and scheduler wrappers")
    expect_true(v["active"], "get_active_deepspeed_plugin(accelerator.state) is the Accelerator's plugin")
    rates = v["rates"]
    expected = _warmup_rates()
    expect_true(max(abs(a - b) for a, b in zip(rates, expected)) < 1e-12,
                f"learning rates: DeepSpeed's WarmupLR (0 up to the DummyOptim's lr) stepped once per step by the engine: {rates}, expected {expected}")
    for other in values[1:]:
        expect_equal(other["rates"], rates, "every rank's learning rates")
    _check_state(v["state"], _replay_adamw(values, expected), "AdamW (weight decay from the DummyOptim) at those rates", tolerance=1e-5)


@case("plugin.deepspeed_zero", worlds=[2], timeout=DEEPSPEED_CASE_TIMEOUT, imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_offload_optimizer(impl, world):
    """ZeRO-2 with the optimizer offloaded to the CPU: the torch AdamW becomes DeepSpeed's CPU Adam (AdamW mode)
    and trains to the AdamW result (the first use JIT-compiles deepspeed's cpu_adam op)."""
    _require_deepspeed()
    config = _deepspeed_config(train_micro_batch_size_per_gpu=BATCH, gradient_clipping=0.0,
                               zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    acc = impl.Accelerator(deepspeed_plugin=impl.utils.DeepSpeedPlugin(hf_ds_config=config))
    model = _net()
    model, optimizer = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=DUMMY_LR, weight_decay=DUMMY_WEIGHT_DECAY))
    steps = [_rank_batch(world, step) for step in range(STEPS)]
    _train(acc, model, optimizer, steps)
    state = acc.get_state_dict(model)
    stepped = getattr(model, "basic_optimizer", None)  # what a DeepSpeedEngine steps (nothing on another wrapper)
    return {"optimizer": type(stepped).__name__, "indices": [batch.tolist() for batch in steps],
            "state": _plain(state) if acc.is_main_process else None}


@plugin_deepspeed_offload_optimizer.check
def _offload_optimizer_check(values, world):
    expect_equal(values[0]["optimizer"], "DeepSpeedCPUAdam", "the optimizer DeepSpeed steps with offload_optimizer on the CPU")
    _check_state(values[0]["state"], _replay_adamw(values, [DUMMY_LR] * STEPS), "ZeRO-2 with the optimizer offloaded", tolerance=1e-5)


def _two_plugins_run(impl: Any, world: Any) -> dict:
    """A ZeRO-2 student trained and a ZeRO-3 teacher for inference, from ``deepspeed_plugins`` by name."""
    _require_deepspeed()
    config = _deepspeed_config(train_micro_batch_size_per_gpu=BATCH, gradient_clipping=0.0)
    plugins = {name: impl.utils.DeepSpeedPlugin(hf_ds_config=config, zero_stage=stage) for name, stage in (("student", 2), ("teacher", 3))}
    acc = impl.Accelerator(deepspeed_plugins=plugins)
    active = [acc.deepspeed_plugin is plugins["student"]]
    student = _net()
    student, optimizer = acc.prepare(student, torch.optim.SGD(student.parameters(), lr=LR))
    acc.state.select_deepspeed_plugin("teacher")
    active += [acc.deepspeed_plugin is plugins["teacher"], impl.utils.get_active_deepspeed_plugin(acc.state) is plugins["teacher"],
               not plugins["student"].selected, acc.state.get_deepspeed_plugin("student") is plugins["student"]]
    torch.manual_seed(1)
    teacher = acc.prepare(_Net())
    inputs = _DATA[:4, :WIDTH]
    with torch.no_grad():
        taught = teacher(inputs).reshape(-1).tolist()
    _train(acc, student, optimizer, [_rank_batch(world, step) for step in range(STEPS)])
    state = acc.get_state_dict(student)
    return {"active": active, "stages": [student.zero_optimization_stage(), teacher.zero_optimization_stage()],
            "taught": taught, "indices": [_rank_batch(world, step).tolist() for step in range(STEPS)],
            "state": _plain(state) if acc.is_main_process else None}


@case("plugin.deepspeed_config", worlds=[2], timeout=DEEPSPEED_CASE_TIMEOUT, imports=DEEPSPEED_IMPORTS)
def plugin_deepspeed_several_plugins(impl, world):
    """``deepspeed_plugins={name: plugin}``: the first is active, `select_deepspeed_plugin` switches the one
    `prepare` uses (a ZeRO-3 teacher next to a ZeRO-2 student); `backward` trains the first engine."""
    return _two_plugins_run(impl, world)


@plugin_deepspeed_several_plugins.check
def _several_plugins_check(values, world):
    v = values[0]
    expect_equal(v["active"], [True] * 5, "active plugin: the first, then the selected one (deepspeed_plugin, "
                 "get_active_deepspeed_plugin, the other unselected, get_deepspeed_plugin by name)")
    expect_equal(v["stages"], [2, 3], "ZeRO stage of the student and of the teacher engine (each from its plugin)")
    torch.manual_seed(1)
    with torch.no_grad():
        plain = _Net()(_DATA[:4, :WIDTH]).reshape(-1).tolist()
    for rank, other in enumerate(values):
        _close(other["taught"], plain, f"rank {rank}: the ZeRO-3 teacher's outputs (vs the plain model)")
    _check_state(v["state"], _replay(values), "the student trained through backward", tolerance=1e-5)
