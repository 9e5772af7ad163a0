"""Unit tests of `accelerate_ref.utils.deepspeed` that need no deepspeed package: `HfDeepSpeedConfig`, the
dummies' config values and refusals, `get_active_deepspeed_plugin`. Training through the engine is in the
conformance cases (``plugin.deepspeed_zero``, ``plugin.deepspeed_config``).

Catalog: plugin.deepspeed_config.
"""

from __future__ import annotations

import base64
import json

import pytest
import torch

import accelerate_ref
from accelerate_ref.utils import DummyOptim, DummyScheduler, HfDeepSpeedConfig, get_active_deepspeed_plugin
from accelerate_ref.utils.deepspeed import _check_config_objects, _dummy_values

CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "fp16": {"enabled": False},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "overlap_comm": True},
}
QUERIES = ["zero_optimization.stage", "zero_optimization.overlap_comm", "fp16.enabled", "bf16.enabled", "missing.key"]


def _forms(tmp_path) -> dict:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CONFIG))
    text = json.dumps(CONFIG)
    return {"dict": CONFIG, "path": str(path), "json": text, "base64": base64.urlsafe_b64encode(text.encode()).decode()}


@pytest.mark.parametrize("form", ["dict", "path", "json", "base64"])
def test_hf_deepspeed_config_reads_every_form_and_answers_as_hf(tmp_path, form):
    config = HfDeepSpeedConfig(_forms(tmp_path)[form])
    assert config.config == CONFIG and config.config is not CONFIG
    assert (config.is_zero3(), config.is_zero2(), config.is_offload()) == (True, False, True)
    answers = [(config.get_value(q), config.is_true(q), config.is_false(q)) for q in QUERIES]
    assert answers == [(3, True, False), (True, True, False), (False, False, True), (None, False, False), (None, False, False)]
    hf = pytest.importorskip("accelerate.utils.deepspeed").HfDeepSpeedConfig(_forms(tmp_path)[form])
    assert answers == [(hf.get_value(q), hf.is_true(q), hf.is_false(q)) for q in QUERIES]


def test_hf_deepspeed_config_refuses_what_does_not_parse_and_deletes_by_key():
    with pytest.raises(ValueError, match="deepspeed config"):
        HfDeepSpeedConfig("{not json")
    config = HfDeepSpeedConfig(CONFIG)
    config.del_config_sub_tree("zero_optimization.offload_param")
    config.set_stage_and_offload()
    assert not config.is_offload() and "offload_param" in CONFIG["zero_optimization"]
    config.del_config_sub_tree("bf16.enabled")  # missing: nothing to do
    with pytest.raises(ValueError, match="bf16.enabled"):
        config.del_config_sub_tree("bf16.enabled", must_exist=True)


def test_dummies_fill_the_config_sections_as_hf():
    parameters = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = DummyOptim(parameters, lr=0.02, weight_decay=0.1, betas=(0.9, 0.99))
    scheduler = DummyScheduler(optimizer, total_num_steps=9, warmup_num_steps=0)
    assert optimizer.kwargs == {"betas": (0.9, 0.99)}
    assert _dummy_values(optimizer, scheduler, num_processes=2, split_batches=False) == {
        "optimizer.params.lr": 0.02,
        "optimizer.params.weight_decay": 0.1,
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": 0.02,
        "scheduler.params.warmup_num_steps": 1,  # at least 1: deepspeed refuses 0
        "scheduler.params.total_num_steps": 5,  # ceil(9 / 2) steps per process
    }
    assert _dummy_values(optimizer, scheduler, num_processes=2, split_batches=True)["scheduler.params.total_num_steps"] == 9
    torch_optimizer = torch.optim.SGD(parameters, lr=0.3)
    assert _dummy_values(torch_optimizer, DummyScheduler(torch_optimizer), 1, False)["scheduler.params.warmup_max_lr"] == 0.3


@pytest.mark.parametrize(
    ("config", "optimizer", "scheduler", "named"),
    [
        ({"optimizer": {}}, "torch", None, "optimizer in the config file and in the code"),
        ({}, "dummy", None, "DummyOptim` without specifying an optimizer"),
        ({"optimizer": {}, "scheduler": {}}, "dummy", "torch", "scheduler in the config file and in the code"),
        ({"optimizer": {}}, "dummy", "dummy", "lr_scheduler_callable"),
        ({"optimizer": {}}, "dummy", "torch", "DummyScheduler"),
    ],
)
def test_contradicting_optimizer_or_scheduler_is_refused(config, optimizer, scheduler, named):
    parameters = [torch.nn.Parameter(torch.zeros(2))]
    optimizers = {"torch": torch.optim.SGD(parameters, lr=0.1), "dummy": DummyOptim(parameters)}
    schedulers = {None: None, "torch": torch.optim.lr_scheduler.StepLR(optimizers["torch"], 1), "dummy": DummyScheduler(optimizers["dummy"])}
    with pytest.raises(ValueError, match=named):
        _check_config_objects(config, optimizers[optimizer], schedulers[scheduler])


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_get_active_deepspeed_plugin_refuses_without_deepspeed():
    accelerator = accelerate_ref.Accelerator()
    assert accelerator.deepspeed_plugin is None
    with pytest.raises(ValueError, match="DeepSpeedPlugin"):
        get_active_deepspeed_plugin(accelerator.state)


@pytest.mark.extended  # the first call JIT-compiles deepspeed's cpu_adam/cpu_adagrad ops (minutes)
@pytest.mark.parametrize(("torch_class", "deepspeed_class"), [(torch.optim.AdamW, "DeepSpeedCPUAdam"), (torch.optim.Adagrad, "DeepSpeedCPUAdagrad")])
def test_map_pytorch_optim_to_deepspeed_steps_as_the_torch_optimizer(torch_class, deepspeed_class):
    pytest.importorskip("deepspeed")
    from accelerate_ref.utils import map_pytorch_optim_to_deepspeed

    torch.manual_seed(0)
    start, gradient = torch.randn(16), torch.randn(16)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    mapped = map_pytorch_optim_to_deepspeed(torch_class([ours], lr=0.01, weight_decay=0.1))
    reference = torch_class([theirs], lr=0.01, weight_decay=0.1)
    assert type(mapped).__name__ == deepspeed_class
    for _ in range(3):
        ours.grad, theirs.grad = gradient.clone(), gradient.clone()
        mapped.step()
        reference.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
