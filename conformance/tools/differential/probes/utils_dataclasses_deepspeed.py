"""Probes of ``accelerate.utils.dataclasses.DeepSpeedPlugin`` (DeepSpeed itself is not needed to build one):
defaults, environment, configs given as dicts and files, the dotted-key helpers, mixed precision, the
transformers registration, selection and every refusal."""

from __future__ import annotations

import json
import os

import torch

from ..probe import Api, probe

AREA = "utils.dataclasses"
PLUGIN = "utils.dataclasses.DeepSpeedPlugin"
#: A config whose values the plugin and the Accelerator fill in.
AUTO_CONFIG = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "auto"}, "offload_param": {"device": "auto"},
                          "stage3_gather_16bit_weights_on_model_save": "auto"},
}
#: A config with every value set.
SET_CONFIG = {
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}},
    "bf16": {"enabled": True},
}


def _copy(config: dict) -> dict:
    return json.loads(json.dumps(config))


def _build(api: Api, label: str, **values) -> object:
    """Build the plugin under ``label``; record its config and selection, which its fields do not show."""
    plugin = api.call(label, PLUGIN, **values)
    if plugin is not None:
        api.record(f"{label}: deepspeed_config", plugin.deepspeed_config)
        api.observe(f"{label}: selected", lambda: plugin.selected)
    return plugin


@probe(AREA)
def deepspeed_plugin_defaults_and_environment(api: Api) -> None:
    _build(api, "defaults")
    _build(api, "every field", gradient_accumulation_steps=4, gradient_clipping=1.0, zero_stage=3,
           offload_optimizer_device="nvme", offload_param_device="cpu", offload_optimizer_nvme_path="/nvme",
           offload_param_nvme_path="/other", zero3_init_flag=False, zero3_save_16bit_model=True,
           transformer_moe_cls_names="Expert", is_train_batch_min=False)
    _build(api, "zero stage 3", zero_stage=3)
    _build(api, "zero3_init_flag on stage 2", zero3_init_flag=True)
    _build(api, "zero stage 7", zero_stage=7)
    _build(api, "an unknown offload device", offload_optimizer_device="disk")
    _build(api, "gradient_clipping 0", gradient_clipping=0)
    os.environ.update({
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "8", "ACCELERATE_GRADIENT_CLIPPING": "2.5",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "nvme", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": "/p",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH": "/o", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "TRUE",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "false",
    })
    _build(api, "from the environment")
    os.environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = "many"
    os.environ["ACCELERATE_DEEPSPEED_ZERO3_INIT"] = "perhaps"
    _build(api, "unreadable environment values")
    os.environ["ACCELERATE_DEEPSPEED_ZERO3_INIT"] = "1"
    os.environ["ACCELERATE_GRADIENT_CLIPPING"] = "steep"
    _build(api, "an unreadable clipping")


@probe(AREA)
def deepspeed_plugin_msamp(api: Api) -> None:
    _build(api, "enable_msamp", enable_msamp=True)
    _build(api, "enable_msamp at O2", enable_msamp=True, msamp_opt_level="O2")
    _build(api, "enable_msamp at O3", enable_msamp=True, msamp_opt_level="O3")
    _build(api, "enable_msamp with ZeRO-3", enable_msamp=True, zero_stage=3)
    _build(api, "a config with an msamp section", enable_msamp=True,
           hf_ds_config=dict(_copy(SET_CONFIG), msamp={"enabled": False}))
    os.environ["ACCELERATE_FP8_BACKEND"] = "MSAMP"
    os.environ["ACCELERATE_FP8_OPT_LEVEL"] = "O2"
    _build(api, "MS-AMP from the environment")


@probe(AREA)
def deepspeed_plugin_configs(api: Api) -> None:
    _build(api, "an auto config", hf_ds_config=_copy(AUTO_CONFIG))
    _build(api, "an auto config with fields", hf_ds_config=_copy(AUTO_CONFIG), zero_stage=3,
           offload_param_device="nvme", offload_param_nvme_path="/nvme", gradient_accumulation_steps=2)
    _build(api, "a set config", hf_ds_config=_copy(SET_CONFIG))
    _build(api, "a set config with agreeing fields", hf_ds_config=_copy(SET_CONFIG), zero_stage=3,
           gradient_accumulation_steps=2)
    _build(api, "a set config with a contradicting field", hf_ds_config=_copy(SET_CONFIG), zero_stage=1)
    _build(api, "a config without zero_optimization", hf_ds_config={"train_batch_size": 8})
    _build(api, "a config without gradient_accumulation_steps", hf_ds_config={"zero_optimization": {"stage": 1}})
    _build(api, "a stage 3 config", hf_ds_config={"zero_optimization": {"stage": 3}})
    path = api.tmp / "ds_config.json"
    path.write_text(json.dumps(SET_CONFIG), encoding="utf-8")
    _build(api, "a config file", hf_ds_config=str(path))
    _build(api, "a config file as a Path", hf_ds_config=path)
    _build(api, "a missing config file", hf_ds_config=str(api.tmp / "missing.json"))
    broken = api.tmp / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    _build(api, "a broken config file", hf_ds_config=str(broken))
    config_class = api.get("utils.deepspeed.HfDeepSpeedConfig")
    _build(api, "an HfDeepSpeedConfig", hf_ds_config=config_class(_copy(AUTO_CONFIG)))
    os.environ["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str(path)
    _build(api, "a config file from the environment")
    os.environ["ACCELERATE_CONFIG_DS_FIELDS"] = "zero_stage,mixed_precision"
    _build(api, "launcher fields beside a config file")
    os.environ["ACCELERATE_CONFIG_DS_FIELDS"] = "deepspeed_config_file,zero3_init_flag"
    _build(api, "launcher fields a config file allows")


@probe(AREA)
def deepspeed_plugin_dotted_keys(api: Api) -> None:
    plugin = api.get(PLUGIN)(hf_ds_config=_copy(AUTO_CONFIG))
    for key in ("train_batch_size", "zero_optimization.stage", "zero_optimization.offload_param.device",
                "missing", "zero_optimization.missing", "missing.deeper"):
        api.observe(f"is_auto {key}", plugin.is_auto, key)
        api.observe(f"get_value {key}", plugin.get_value, key)
    api.observe("get_value with a default", plugin.get_value, "missing", 5)
    plugin = api.get(PLUGIN)(hf_ds_config=dict(_copy(AUTO_CONFIG), optimizer={"params": {"lr": "auto", "eps": 1e-8}}))
    mismatches: list = []
    api.observe("fill_match an auto value", plugin.fill_match, "optimizer.params.lr", mismatches, lr=1,
                **{"optimizer.params.lr": 0.1})
    api.observe("fill_match an auto value without kwargs", plugin.fill_match, "train_batch_size")
    api.observe("fill_match a set value that differs", plugin.fill_match, "optimizer.params.eps", mismatches,
                **{"optimizer.params.eps": 1e-6})
    api.observe("fill_match a set value, must_match False", plugin.fill_match, "optimizer.params.eps", mismatches,
                must_match=False, **{"optimizer.params.eps": 1e-5})
    api.observe("fill_match a missing node", plugin.fill_match, "scheduler.params.lr", mismatches)
    api.record("mismatches", mismatches)
    api.record("config after fill_match", plugin.deepspeed_config)
    values = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "optimizer.params.eps": 1e-8}
    api.observe("deepspeed_config_process missing values", plugin.deepspeed_config_process, **values)
    values["zero_optimization.offload_param.device"] = "none"
    values["zero_optimization.offload_optimizer.device"] = "none"
    api.observe("deepspeed_config_process", plugin.deepspeed_config_process, must_match=False, **values)
    api.record("config after processing", plugin.deepspeed_config)
    api.observe("deepspeed_config_process mismatches", plugin.deepspeed_config_process,
                **dict(values, train_batch_size=32, **{"optimizer.params.eps": 0.5}))
    collected: list = []
    api.observe("deepspeed_config_process with a prefix", plugin.deepspeed_config_process, prefix="zero_optimization.",
                mismatches=collected, config=plugin.deepspeed_config["zero_optimization"], stage=1)
    api.record("mismatches collected under a prefix", collected)


@probe(AREA)
def deepspeed_plugin_set_mixed_precision(api: Api) -> None:
    for precision in ("no", "fp16", "bf16", "fp8"):
        plugin = api.get(PLUGIN)(enable_msamp=precision == "fp8")
        api.observe(f"{precision}", plugin.set_mixed_precision, precision)
        api.record(f"{precision}: config", plugin.deepspeed_config)
    for precision, section in (("fp16", "bf16"), ("bf16", "fp16"), ("fp8", "fp16")):
        plugin = api.get(PLUGIN)(hf_ds_config={"zero_optimization": {"stage": 2}, section: {"enabled": "true"}})
        api.observe(f"{precision} against an enabled {section}", plugin.set_mixed_precision, precision)
    plugin = api.get(PLUGIN)(hf_ds_config={"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"},
                                           "bf16": {"enabled": "auto"}})
    api.observe("auto sections", plugin.set_mixed_precision, "fp16")
    api.record("auto sections: config", plugin.deepspeed_config)


@probe(AREA)
def deepspeed_plugin_transformers_and_selection(api: Api) -> None:
    plugin = api.get(PLUGIN)(hf_ds_config=_copy(AUTO_CONFIG))
    api.observe("is_zero3_init_enabled", plugin.is_zero3_init_enabled)
    api.observe("set_deepspeed_weakref", plugin.set_deepspeed_weakref)
    api.observe("registered config", lambda: plugin.dschf.config)
    api.observe("selected", lambda: plugin.selected)
    api.observe("select by hand", plugin.select)
    api.observe("select from the state", plugin.select, True)
    api.observe("selected after select", lambda: plugin.selected)
    api.observe("set selected", setattr, plugin, "selected", False)
    api.observe("_unselect", plugin._unselect)
    api.observe("selected after _unselect", lambda: plugin.selected)
    zero3 = api.get(PLUGIN)(zero_stage=3)
    api.observe("zero3 is_zero3_init_enabled", zero3.is_zero3_init_enabled)

    def inside(enable: bool) -> object:
        with zero3.zero3_init_context_manager(enable=enable):
            return zero3.is_zero3_init_enabled(), zero3.dschf is None
    api.observe("zero3_init_context_manager(False)", inside, False)
    api.observe("after the context", lambda: (zero3.zero3_init_flag, zero3.dschf is None))
    api.observe("zero3_init_context_manager(True)", inside, True)
    try:
        from transformers.integrations import unset_hf_deepspeed_config
        unset_hf_deepspeed_config()
    except ImportError:
        pass


@probe(AREA)
def deepspeed_plugin_moe_leaf_modules(api: Api) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    plugin = api.get(PLUGIN)()
    api.observe("no class names", plugin.set_moe_leaf_modules, model)
    plugin = api.get(PLUGIN)(transformer_moe_cls_names="Linear")
    api.observe("class names without deepspeed", plugin.set_moe_leaf_modules, model)
    os.environ["ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"] = "Linear,Expert"
    plugin = api.get(PLUGIN)()
    api.observe("class names from the environment", plugin.set_moe_leaf_modules, model)
    api.record("class names read", plugin.transformer_moe_cls_names)
