"""Unit tests of `accelerate_ref.utils.deepspeed` that need no deepspeed package: `HfDeepSpeedConfig`, the
dummies' config values and refusals, `get_active_deepspeed_plugin`. Training through the engine is in the
conformance cases (``plugin.deepspeed_zero``, ``plugin.deepspeed_config``).

Catalog: plugin.deepspeed_config.

Issue 13's DeepSpeed names behave as HF accelerate 1.15's do: `DeepSpeedPlugin` (fields, environment
defaults, config building, config methods, mixed precision, MS-AMP, zero.Init with transformers, MoE
leaf modules), `DeepSpeedSequenceParallelConfig`, `deepspeed_required` and
`Accelerator.deepspeed_ulysses_dl_adapter`.

Each plugin test builds HF's object and ours from the same input and compares them (HF's
plugin class constructs without the deepspeed package, so these run in CI, which has none).
Tests that need DeepSpeed's engine or transformers skip where those are absent.
Catalog: plugin.deepspeed_config, plugin.unavailable_engines.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json
import types
import warnings
from typing import Any

import pytest
import torch

import accelerate_ref
from accelerate_ref.utils import DeepSpeedPlugin, DeepSpeedSequenceParallelConfig, DummyOptim, DummyScheduler, HfDeepSpeedConfig, deepspeed_required, get_active_deepspeed_plugin  # noqa: E402
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


def test_gathered_parameters_is_a_no_op_without_deepspeed() -> None:
    from accelerate_ref import AcceleratorState, PartialState
    from accelerate_ref.utils import GatheredParameters, TorchDynamoPlugin

    PartialState(cpu=True)
    AcceleratorState(cpu=True, dynamo_plugin=TorchDynamoPlugin(), _from_accelerator=True)
    layer = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in layer.parameters()]
    with GatheredParameters(list(layer.parameters()), modifier_rank=0) as inside:
        assert inside is None
        assert all(p.shape == b.shape for p, b in zip(layer.parameters(), before))
    assert all(torch.equal(p, b) for p, b in zip(layer.parameters(), before))


hf_dataclasses = pytest.importorskip("accelerate.utils.dataclasses")


HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="the deepspeed package is not installed")


#: Environment variables either plugin reads; cleared for every test so the machine's own do not leak in.
_PLUGIN_ENV = (
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_CLIPPING", "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "ACCELERATE_DEEPSPEED_ZERO3_INIT", "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", "ACCELERATE_FP8_BACKEND", "ACCELERATE_FP8_OPT_LEVEL",
    "ACCELERATE_CONFIG_DS_FIELDS", "ACCELERATE_MIXED_PRECISION", "PARALLELISM_CONFIG_SP_SEQ_LENGTH",
    "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION",
)


@pytest.fixture
def _clean_env(monkeypatch):
    for name in _PLUGIN_ENV:
        monkeypatch.delenv(name, raising=False)


def _both(cls_name: str, monkeypatch, env: dict[str, str], **kwargs: Any) -> tuple[Any, Any]:
    """HF's and accelerate_ref's ``cls_name`` built from ``kwargs`` under ``env``, each from its own copy of them."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import accelerate_ref.utils.dataclasses as ref_dataclasses

    built = []
    for module in (hf_dataclasses, ref_dataclasses):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built.append(getattr(module, cls_name)(**json.loads(json.dumps(kwargs))))
    return built[0], built[1]


def _fields(plugin: Any) -> dict[str, Any]:
    return {f.name: getattr(plugin, f.name) for f in dataclasses.fields(hf_dataclasses.DeepSpeedPlugin) if f.name != "hf_ds_config"}


AUTO_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": "auto", "offload_param": {"device": "auto", "nvme_path": "auto"}, "offload_optimizer": {"device": "cpu"}},
}


SET_CONFIG = {
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.3,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "nvme_path": "/x"}, "stage3_gather_16bit_weights_on_model_save": True},
}


CONSTRUCTIONS = {
    "defaults": ({}, {}),
    "fields": ({}, dict(zero_stage=3, offload_optimizer_device="nvme", offload_optimizer_nvme_path="/nvme", offload_param_device="cpu",
                        zero3_save_16bit_model=True, gradient_clipping=0.5, gradient_accumulation_steps=4, is_train_batch_min=False,
                        transformer_moe_cls_names="MixtralSparseMoeBlock")),
    "environment": ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3", "ACCELERATE_GRADIENT_CLIPPING": "0.7",
                     "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "nvme",
                     "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": "/local_nvme", "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false",
                     "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true"}, {"zero_stage": 1}),
    "config_autos_from_fields": ({}, dict(hf_ds_config=AUTO_CONFIG, zero_stage=3, offload_param_device="nvme", offload_param_nvme_path="/nvme")),
    "config_autos_from_defaults": ({}, dict(hf_ds_config=AUTO_CONFIG)),
    "config_values_to_fields": ({}, dict(hf_ds_config=SET_CONFIG)),
    "msamp": ({}, dict(enable_msamp=True, msamp_opt_level="O2", zero_stage=1)),
    "msamp_from_environment": ({"ACCELERATE_FP8_BACKEND": "MSAMP", "ACCELERATE_FP8_OPT_LEVEL": "O2"}, {}),
    "msamp_section_kept": ({}, dict(hf_ds_config={**SET_CONFIG, "msamp": {"enabled": False}}, enable_msamp=True)),
    "zero3_init_dropped_below_stage_3": ({}, dict(zero_stage=2, zero3_init_flag=True)),
}


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.parametrize("name", list(CONSTRUCTIONS))
def test_plugin_fields_and_config_match_hf(name, monkeypatch):
    env, kwargs = CONSTRUCTIONS[name]
    hf, ref = _both("DeepSpeedPlugin", monkeypatch, env, **kwargs)
    assert ref.deepspeed_config == hf.deepspeed_config
    assert _fields(ref) == _fields(hf)
    assert ref.hf_ds_config.config is ref.deepspeed_config and ref.hf_ds_config.is_zero3() == hf.hf_ds_config.is_zero3()
    assert ref.hf_ds_config.is_offload() == hf.hf_ds_config.is_offload()


@pytest.mark.usefixtures("_clean_env")
def test_config_file_from_path_and_environment_match_hf(tmp_path, monkeypatch):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(AUTO_CONFIG))
    hf, ref = _both("DeepSpeedPlugin", monkeypatch, {}, hf_ds_config=str(path), zero_stage=1)
    assert ref.deepspeed_config == hf.deepspeed_config and _fields(ref) == _fields(hf)
    hf, ref = _both("DeepSpeedPlugin", monkeypatch, {"ACCELERATE_DEEPSPEED_CONFIG_FILE": str(path)})
    assert ref.deepspeed_config == hf.deepspeed_config and ref.get_value("zero_optimization.stage") == 2


REFUSALS = {
    "msamp_with_zero3": ({}, dict(enable_msamp=True, zero_stage=3), NotImplementedError),
    "msamp_opt_level": ({}, dict(enable_msamp=True, msamp_opt_level="O3"), ValueError),
    "config_without_zero_section": ({}, dict(hf_ds_config={"train_batch_size": 8}), ValueError),
    "launcher_field_beside_config_file": ({"ACCELERATE_CONFIG_DS_FIELDS": "zero_stage,mixed_precision"}, dict(hf_ds_config=SET_CONFIG), ValueError),
}


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.parametrize("name", list(REFUSALS))
def test_plugin_refusals_match_hf(name, monkeypatch):
    env, kwargs, error = REFUSALS[name]
    for module in ("accelerate.utils.dataclasses", "accelerate_ref.utils.dataclasses"):
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            with pytest.raises(error):
                getattr(importlib.import_module(module), "DeepSpeedPlugin")(**kwargs)


@pytest.mark.usefixtures("_clean_env")
def test_a_given_field_contradicting_the_config_is_refused_naming_the_key():
    """The catalog's rule (plugin.deepspeed_config), where HF keeps the config's value (manifest deviation)."""
    with pytest.raises(ValueError, match=r"zero_optimization\.stage=3 vs arg zero_optimization\.stage=2"):
        DeepSpeedPlugin(hf_ds_config=SET_CONFIG, zero_stage=2)
    plugin = DeepSpeedPlugin(hf_ds_config=SET_CONFIG)  # environment defaults (stage 2) never contradict
    assert plugin.zero_stage == 3


@pytest.mark.usefixtures("_clean_env")
def test_config_methods_match_hf(monkeypatch):
    hf, ref = _both("DeepSpeedPlugin", monkeypatch, {}, hf_ds_config={**AUTO_CONFIG, "train_batch_size": 16}, zero_stage=2)
    keys = ["zero_optimization.stage", "train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization.nope", "nope.deeper"]
    assert [(ref.get_value(k), ref.get_value(k, "d"), ref.is_auto(k)) for k in keys] == [
        (hf.get_value(k), hf.get_value(k, "d"), hf.is_auto(k)) for k in keys
    ]
    values = {"train_batch_size": 32, "zero_optimization.stage": 3, "train_micro_batch_size_per_gpu": 4}
    lists: list[list[str]] = []
    for plugin in (hf, ref):
        mismatches: list[str] = []
        for key in values:
            plugin.fill_match(key, mismatches, **values)
        plugin.fill_match("train_batch_size", mismatches, must_match=False, **values)
        with pytest.raises(ValueError, match="gradient_accumulation_steps"):  # still "auto", no value given
            plugin.fill_match("gradient_accumulation_steps", mismatches, **values)
        section: list[str] = []
        plugin.deepspeed_config_process(prefix="zero_optimization.", mismatches=section, config=plugin.deepspeed_config["zero_optimization"],
                                        **{"zero_optimization.stage": 1, "zero_optimization.offload_optimizer.device": "none"})
        lists.append(mismatches + section)
        with pytest.raises(ValueError, match="train_batch_size=16 vs arg train_batch_size=8"):
            plugin.deepspeed_config_process(must_match=True, gradient_accumulation_steps=1, gradient_clipping=1.0, train_batch_size=8)
        plugin.deepspeed_config_process(must_match=False, gradient_accumulation_steps=1, gradient_clipping=1.0, train_batch_size=8)
    assert lists[1] == lists[0] and len(lists[0]) == 4
    assert ref.deepspeed_config == hf.deepspeed_config


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.parametrize("mixed_precision", ["no", "fp16", "bf16", "fp8"])
@pytest.mark.parametrize("sections", [{}, {"bf16": {"enabled": "auto"}}, {"fp16": {"enabled": True}}, {"fp16": {"enabled": "auto", "loss_scale": 0}}])
def test_set_mixed_precision_matches_hf(mixed_precision, sections, monkeypatch):
    config = {**SET_CONFIG, "zero_optimization": {"stage": 1}, **sections}
    hf, ref = _both("DeepSpeedPlugin", monkeypatch, {}, hf_ds_config=config, enable_msamp=mixed_precision == "fp8")
    outcomes = []
    for plugin in (hf, ref):
        try:
            plugin.set_mixed_precision(mixed_precision)
            outcomes.append(plugin.deepspeed_config)
        except ValueError as error:
            outcomes.append(str(error))
    assert outcomes[1] == outcomes[0]


@pytest.mark.usefixtures("_clean_env")
def test_selection_is_only_through_the_state(monkeypatch):
    for plugin in _both("DeepSpeedPlugin", monkeypatch, {}):
        assert plugin.selected is False
        with pytest.raises(ValueError, match="enable_deepspeed_plugin"):
            plugin.select()
        with pytest.raises(NotImplementedError):
            plugin.selected = True
        assert plugin.is_zero3_init_enabled() is False


SEQUENCE_PARALLEL = {
    "defaults": ({}, {}),
    "fixed_length": ({}, dict(sp_seq_length=256, sp_seq_length_is_variable=False, sp_attn_implementation="sdpa")),
    "environment": ({"PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE": "false", "PARALLELISM_CONFIG_SP_SEQ_LENGTH": "128",
                     "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION": "flash_attention_2"}, {}),
    "environment_length_none": ({"PARALLELISM_CONFIG_SP_SEQ_LENGTH": "None"}, dict(sp_seq_length_is_variable=False)),
    "hub_kernel": ({}, dict(sp_attn_implementation="kernels-community/flash-attn2")),
    "fixed_without_length": ({}, dict(sp_seq_length_is_variable=False)),
    "eager": ({}, dict(sp_attn_implementation="eager")),
    "unknown_kernel": ({}, dict(sp_attn_implementation="kernels-community/vllm-flash")),
}


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.parametrize("name", list(SEQUENCE_PARALLEL))
def test_sequence_parallel_config_matches_hf(name, monkeypatch):
    env, kwargs = SEQUENCE_PARALLEL[name]
    outcomes = []
    for module in ("accelerate.utils.dataclasses", "accelerate_ref.utils.dataclasses"):
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            try:
                outcomes.append(dataclasses.asdict(importlib.import_module(module).DeepSpeedSequenceParallelConfig(**kwargs)))
            except ValueError as error:
                outcomes.append(("ValueError", str(error)))
    assert outcomes[1] == outcomes[0]
    assert DeepSpeedSequenceParallelConfig.__dataclass_fields__.keys() == hf_dataclasses.DeepSpeedSequenceParallelConfig.__dataclass_fields__.keys()


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_deepspeed_required_refuses_once_a_state_without_deepspeed_exists():
    @deepspeed_required
    def answer(value: int) -> int:
        """The wrapped function."""
        return value

    assert answer(3) == 3 and answer.__doc__ == "The wrapped function."  # no state yet: HF lets it through
    accelerate_ref.Accelerator()
    with pytest.raises(ValueError, match="DeepSpeed is not enabled"):
        answer(3)


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_ulysses_adapter_without_sequence_parallelism_returns_the_loader():
    """HF's rule without a parallelism config (sp_size 1); accelerate_ref has no ParallelismConfig yet."""
    accelerator = accelerate_ref.Accelerator()
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, torch.nn.Linear(2, 2)) is loader


@pytest.mark.usefixtures("_clean_env")
@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed")
def test_set_deepspeed_weakref_names_transformers_where_it_is_missing():
    with pytest.raises(ImportError, match="transformers"):
        DeepSpeedPlugin(zero_stage=3).set_deepspeed_weakref()


@pytest.mark.usefixtures("_clean_env")
@needs_deepspeed
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_zero3_weakref_and_context_manager_match_hf(monkeypatch):
    from transformers.integrations import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    seen = []
    for plugin in _both("DeepSpeedPlugin", monkeypatch, {}, zero_stage=3):
        plugin.set_deepspeed_weakref()
        states = [(is_deepspeed_zero3_enabled(), plugin.is_zero3_init_enabled(), plugin.dschf.config)]
        with plugin.zero3_init_context_manager(enable=False):
            states.append((is_deepspeed_zero3_enabled(), plugin.is_zero3_init_enabled(), plugin.dschf.config))
        states.append((is_deepspeed_zero3_enabled(), plugin.is_zero3_init_enabled(), plugin.dschf.config))
        seen.append(states)
        unset_hf_deepspeed_config()  # later tests load transformers models without ZeRO-3
    assert seen[1] == seen[0] and seen[0][1][1] is False and seen[0][2][1] is True


class Expert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class MoeNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList([Expert(), Expert()])
        self.head = torch.nn.Linear(4, 1)
        self.config = types.SimpleNamespace(hidden_size=4)  # as a transformers model has

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(sum(expert(x) for expert in self.experts))


@pytest.mark.usefixtures("_clean_env")
def test_auto_bucket_sizes_follow_the_models_hidden_size():
    from accelerate_ref.utils.deepspeed import hidden_size_values

    zero = {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto"}
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": zero})
    model = MoeNet()
    assert hidden_size_values(model, plugin) == {"zero_optimization.reduce_bucket_size": 16,
                                                 "zero_optimization.stage3_prefetch_bucket_size": 14,
                                                 "zero_optimization.stage3_param_persistence_threshold": 40}
    model.config = types.SimpleNamespace(hidden_sizes=[3, 10, 5])
    assert hidden_size_values(model, plugin)["zero_optimization.reduce_bucket_size"] == 100
    partly = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {**zero, "reduce_bucket_size": 7}})
    assert set(hidden_size_values(model, partly)) == {"zero_optimization.stage3_prefetch_bucket_size",
                                                      "zero_optimization.stage3_param_persistence_threshold"}
    del model.config
    with pytest.raises(ValueError, match="model.config.*reduce_bucket_size"):
        hidden_size_values(model, plugin)
    assert hidden_size_values(model, DeepSpeedPlugin()) == {}


@pytest.mark.usefixtures("_clean_env")
@needs_deepspeed
def test_set_moe_leaf_modules_matches_hf(monkeypatch):
    from deepspeed.utils import z3_leaf_module

    flags = []
    for plugin in _both("DeepSpeedPlugin", monkeypatch, {"ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "Expert"}, zero_stage=3):
        model = MoeNet()
        plugin.set_moe_leaf_modules(model)
        flags.append([(name, z3_leaf_module(module)) for name, module in model.named_modules()])
        plugin.transformer_moe_cls_names = "Expert,NoSuchBlock"
        with pytest.raises(Exception, match="NoSuchBlock"):
            plugin.set_moe_leaf_modules(MoeNet())
    assert flags[1] == flags[0] and ("experts.0", True) in flags[0] and ("head", False) in flags[0]


@pytest.mark.usefixtures("_clean_env")
@needs_deepspeed
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_enable_msamp_is_refused_at_the_accelerator_naming_the_package():
    with pytest.raises(ImportError, match="msamp"):
        accelerate_ref.Accelerator(deepspeed_plugin=DeepSpeedPlugin(enable_msamp=True))


class _SequenceParallelGroups:
    """What DeepSpeed's Ulysses registration hands ``deepspeed.initialize`` as ``mpu``: here every rank is one
    sequence-parallel group (accelerate_ref has no ParallelismConfig to ask for one yet)."""

    def get_sequence_parallel_group(self) -> Any:
        return torch.distributed.group.WORLD

    def get_sequence_parallel_world_size(self) -> int:
        return torch.distributed.get_world_size()

    def get_sequence_parallel_rank(self) -> int:
        return torch.distributed.get_rank()


def deepspeed_rank_checks() -> dict:
    """On each rank: prepare under DeepSpeed with the plugin's fields set, train a step, and shard a loader with Ulysses."""
    import accelerate.accelerator as hf_accelerator
    from deepspeed.utils import groups, z3_leaf_module

    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
              "gradient_clipping": "auto", "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    plugin = DeepSpeedPlugin(hf_ds_config=config, is_train_batch_min=False, transformer_moe_cls_names="Expert")
    accelerator = accelerate_ref.Accelerator(deepspeed_plugin=plugin, mixed_precision="bf16")
    small = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2)
    large = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)
    model = MoeNet()
    engine, _, small, large = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), small, large)
    accelerator.backward(engine(next(iter(small)).to(engine.device, torch.bfloat16)).float().pow(2).mean())

    @deepspeed_required
    def active_stage() -> int:
        return accelerator.state.deepspeed_plugin.zero_stage

    rank = torch.distributed.get_rank()
    batches = [{"input_ids": torch.arange(4).view(1, 4) + 10 * rank + 100 * step, "position_ids": torch.arange(4).view(1, 4),
                "labels": torch.arange(4).view(1, 4)} for step in range(2)]
    plain = accelerator.deepspeed_ulysses_dl_adapter(batches, engine)
    accelerator.state.parallelism_config = types.SimpleNamespace(sp_size=2)  # the property reads the state
    groups.mpu = _SequenceParallelGroups()
    sharded = [_listed(batch) for batch in accelerator.deepspeed_ulysses_dl_adapter(batches, engine)]
    hf_self = types.SimpleNamespace(parallelism_config=accelerator.parallelism_config)  # all HF's method reads of self
    hf_sharded = [_listed(batch) for batch in hf_accelerator.Accelerator.deepspeed_ulysses_dl_adapter(hf_self, batches, engine)]
    return {
        "engine": type(engine).__name__,
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "clipping": engine.gradient_clipping(),
        "reduce_bucket_size": engine.zero_reduce_bucket_size(),
        "bf16": engine.bfloat16_enabled(),
        "param_dtype": str(next(engine.module.parameters()).dtype),
        "leaf": [z3_leaf_module(module) for module in engine.module.experts] + [z3_leaf_module(engine.module.head)],
        "stage": active_stage(),
        "plain_is_loader": plain is batches,
        "sharded": sharded,
        "hf_sharded": hf_sharded,
    }


def _listed(batch: dict) -> dict:
    return {key: value.tolist() for key, value in batch.items()}


@pytest.mark.extended  # a minute: it builds DeepSpeed engines (make installs deepspeed now)
@pytest.mark.usefixtures("_clean_env")
@needs_deepspeed
def test_plugin_fields_take_effect_in_deepspeeds_engine():
    import simulators

    reports = simulators.run(deepspeed_rank_checks, world=2, timeout=240)
    for rank, report in enumerate(reports):
        assert report["engine"] == "DeepSpeedEngine"
        assert report["micro_batch"] == 4, "is_train_batch_min=False: the largest loader's batch size"
        assert report["clipping"] == 1.0, "an 'auto' gradient_clipping is 1.0 at prepare, as HF"
        assert report["reduce_bucket_size"] == 16, "an 'auto' reduce_bucket_size is hidden_size squared"
        assert report["bf16"] and report["param_dtype"] == "torch.bfloat16", "mixed_precision='bf16' reaches DeepSpeed's config"
        assert report["leaf"] == [True, True, False], "transformer_moe_cls_names marks ZeRO-3 leaf modules"
        assert report["stage"] == 2 and report["plain_is_loader"]
        # Ulysses: step s serves rank s's batch, each rank its half of the sequence.
        expected = [[[10 * source + 2 * rank + i for i in range(2)]] for source in range(2)] + [
            [[100 + 10 * source + 2 * rank + i for i in range(2)]] for source in range(2)
        ]
        assert [batch["input_ids"] for batch in report["sharded"]] == expected
        assert report["sharded"] == report["hf_sharded"], "the same micro batches as HF's method"


@pytest.mark.usefixtures("_clean_env")
def test_the_micro_batch_size_is_the_configs_else_the_data_loaders_in_hfs_words():
    """HF's rule (accelerate 1.15, ``_prepare_deepspeed``): a micro batch size the config sets wins over the data
    loaders' (even with none prepared, as a model-only dry run does); an "auto" one takes the smallest loader's
    batch (the largest with ``is_train_batch_min=False``, split among the processes with ``split_batches``) and,
    with no loader or one without a batch size, is refused in HF's words."""
    from accelerate_ref.utils.deepspeed import NO_BATCH_SIZE, NONE_BATCH_SIZE, micro_batch_size

    loaders = [torch.utils.data.DataLoader(range(8), batch_size=size) for size in (4, 2)]
    zero = {"zero_optimization": {"stage": 2}}
    three = DeepSpeedPlugin(hf_ds_config={**zero, "train_micro_batch_size_per_gpu": 3})
    assert micro_batch_size(three, [], False, 2) == 3 and micro_batch_size(three, loaders, False, 2) == 3
    auto = DeepSpeedPlugin(hf_ds_config={**zero, "train_micro_batch_size_per_gpu": "auto"})
    assert micro_batch_size(auto, loaders, False, 2) == 2
    assert micro_batch_size(auto, loaders, True, 2) == 1
    auto.is_train_batch_min = False
    assert micro_batch_size(auto, loaders, False, 2) == 4
    with pytest.raises(ValueError) as caught:
        micro_batch_size(auto, [], False, 2)
    assert str(caught.value) == NO_BATCH_SIZE and "at least one of training or evaluation dataloaders" in NO_BATCH_SIZE
    with pytest.raises(ValueError) as caught:
        micro_batch_size(auto, [torch.utils.data.DataLoader(range(8), batch_size=None)], False, 2)
    assert str(caught.value) == NONE_BATCH_SIZE
