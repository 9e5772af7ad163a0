"""Probes of ``accelerate.utils.dataclasses.MegatronLMPlugin`` and its model-config parsers: none needs
Megatron-LM (only the tensorboard logging options import it), so every argument they fill is compared."""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from ..probe import Api, probe

AREA = "utils.dataclasses"
PLUGIN = "utils.dataclasses.MegatronLMPlugin"

#: ``config`` attributes of one small model per parser.
CONFIGS = {
    "megatron-bert": dict(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, max_position_embeddings=16,
                          num_labels=3, vocab_size=50),
    "gpt2": dict(n_layer=2, n_embd=8, n_head=2, n_positions=32, vocab_size=50),
    "t5": dict(num_layers=2, d_model=8, num_heads=2, vocab_size=50),
    "llama": dict(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, vocab_size=50,
                  max_position_embeddings=64),
    "glm4_moe": dict(num_hidden_layers=3, hidden_size=8, num_attention_heads=2, vocab_size=50,
                     max_position_embeddings=64, head_dim=4, use_qk_norm=True, num_key_value_heads=1,
                     intermediate_size=16, moe_intermediate_size=4, num_experts_per_tok=2, routed_scaling_factor=1.5,
                     first_k_dense_replace=1, n_routed_experts=4, rope_theta=10000.0, partial_rotary_factor=0.5,
                     eos_token_id=2, bf16=True, tie_word_embeddings=False, fp8_param=True, fp8="e4m3",
                     fp8_param_gather=True, fp8_recipe="delayed"),
}


class BertForMaskedLM:
    """Stands in for a transformers model: the parsers read ``config`` and the class name."""

    def __init__(self, model_type: str, **config) -> None:
        self.config = SimpleNamespace(model_type=model_type, return_dict=True, **config)


def _batch(length: int) -> dict:
    return {"input_ids": torch.zeros(2, length, dtype=torch.long), "labels": torch.zeros(2, length + 1)}


def _args(api: Api, label: str, plugin: object) -> None:
    api.record(f"{label}: default args", plugin.megatron_lm_default_args)


@probe(AREA)
def megatron_plugin_construction(api: Api) -> None:
    for label, values in {
        "defaults": {},
        "every parallel degree": {"tp_degree": 2, "pp_degree": 2, "num_micro_batches": 4, "gradient_clipping": 0.5,
                                  "sequence_parallelism": True, "recompute_activations": True,
                                  "use_distributed_optimizer": True, "pipeline_model_parallel_split_rank": 1,
                                  "num_layers_per_virtual_pipeline_stage": 2},
        "zero degrees": {"tp_degree": 0, "pp_degree": 0, "num_micro_batches": 0},
        "sequence parallelism at tp 1": {"sequence_parallelism": True},
        "distributed optimizer": {"use_distributed_optimizer": True},
        "one consumed sample count": {"consumed_samples": [5]},
        "two consumed sample counts": {"consumed_samples": [5, 6]},
        "no consumed sample counts": {"consumed_samples": []},
        "a tensorboard dir": {"tensorboard_dir": "tb"},
        "other arguments": {"other_megatron_args": {"clip_grad": 0.1, "extra": 1}},
    }.items():
        plugin = api.call(label, PLUGIN, **values)
        if plugin is not None:
            _args(api, label, plugin)
    api.call("all logging options", PLUGIN, tensorboard_dir="tb", set_all_logging_options=True)
    os.environ.update({"MEGATRON_LM_TP_DEGREE": "4", "MEGATRON_LM_PP_DEGREE": "2",
                       "MEGATRON_LM_DECODER_LAST_PIPELINE_NUM_LAYERS": "3", "MEGATRON_LM_GRADIENT_CLIPPING": "0.25",
                       "MEGATRON_LM_ATTENTION_BACKEND": "false", "MEGATRON_LM_RECOMPUTE_METHOD": "block"})
    plugin = api.call("from the environment", PLUGIN)
    if plugin is not None:
        _args(api, "from the environment", plugin)
    os.environ["MEGATRON_LM_TP_DEGREE"] = "two"
    api.call("an unreadable degree", PLUGIN)
    os.environ["MEGATRON_LM_TP_DEGREE"] = "1"
    os.environ["MEGATRON_LM_USE_CUSTOM_FSDP"] = "sometimes"
    api.call("an unreadable flag", PLUGIN)


@probe(AREA)
def megatron_plugin_setters(api: Api) -> None:
    plugin = api.get(PLUGIN)(num_micro_batches=2)
    for precision in ("no", "fp16", "bf16"):
        api.observe(f"set_mixed_precision {precision}", plugin.set_mixed_precision, precision)
    api.observe("set_scheduler_args before the training args", plugin.set_scheduler_args,
                SimpleNamespace(total_num_steps=100, warmup_num_steps=10))
    api.observe("set_training_args", plugin.set_training_args, 4, 2)
    parameter = torch.nn.Parameter(torch.zeros(1))
    for optimizer in (torch.optim.AdamW([parameter], lr=0.1, weight_decay=0.01),
                      torch.optim.SGD([parameter], lr=0.2, momentum=0.9),
                      torch.optim.RMSprop([parameter], lr=0.3)):
        api.observe(f"set_optimizer_type {type(optimizer).__name__}", plugin.set_optimizer_type, optimizer)
    api.observe("set_scheduler_args", plugin.set_scheduler_args, SimpleNamespace(total_num_steps=100,
                                                                                 warmup_num_steps=10))
    _args(api, "after the setters", plugin)
    samples = api.get(PLUGIN)(train_samples=1000, lr_warmup_samples=100)
    api.observe("samples: set_training_args", samples.set_training_args, 1, 4)
    api.observe("samples: set_scheduler_args", samples.set_scheduler_args,
                SimpleNamespace(total_num_steps=40, warmup_num_steps=8))
    _args(api, "samples", samples)
    given = api.get(PLUGIN)(train_iters=7, lr_warmup_iters=1, train_samples=9)
    api.observe("given iterations: set_training_args", given.set_training_args, 1, 1)
    api.observe("given iterations: set_scheduler_args", given.set_scheduler_args, SimpleNamespace())
    _args(api, "given iterations", given)
    api.observe("set_tensorboard_logging_options", plugin.set_tensorboard_logging_options)


@probe(AREA)
def megatron_model_config_parsers(api: Api) -> None:
    api.observe("registered model types", lambda: list(api.get("utils.dataclasses.MODEL_CONFIGS_TO_MEGATRON_PARSERS")))
    for model_type, config in CONFIGS.items():
        for label, plugin_values, batch in (
            ("defaults", {}, None),
            ("a batch", {}, _batch(12)),
            ("seq_length set", {"seq_length": 20}, None),
            ("both lengths set", {"seq_length": 20, "encoder_seq_length": 24, "decoder_seq_length": 28}, _batch(12)),
            ("decoder length only", {"decoder_seq_length": 28}, None),
        ):
            plugin = api.get(PLUGIN)(**plugin_values)
            model = BertForMaskedLM(model_type, **config)
            api.observe(f"{model_type} {label}", plugin.set_network_size_args, model, batch)
            _args(api, f"{model_type} {label}", plugin)
            api.record(f"{model_type} {label}: lengths",
                       (plugin.seq_length, plugin.encoder_seq_length, plugin.decoder_seq_length))
    plugin = api.get(PLUGIN)()
    api.observe("an unsupported model type", plugin.set_network_size_args, BertForMaskedLM("mistral"))
    api.observe("a model type containing a registered one", plugin.set_network_size_args,
                BertForMaskedLM("my-llama-variant", **CONFIGS["llama"]))
    for name in ("parse_bert_config", "parse_gpt2_config", "parse_t5_config", "parse_llama_config",
                 "parse_glm4_moe_config"):
        plugin = api.get(PLUGIN)()
        model_type = {"parse_bert_config": "megatron-bert", "parse_gpt2_config": "gpt2", "parse_t5_config": "t5",
                      "parse_llama_config": "llama", "parse_glm4_moe_config": "glm4_moe"}[name]
        api.call(f"{name} directly", f"utils.dataclasses.{name}", plugin, BertForMaskedLM(model_type,
                                                                                          **CONFIGS[model_type]), None)
        _args(api, f"{name} directly", plugin)
    api.call("parse_gpt2_config of a bert", "utils.dataclasses.parse_gpt2_config", api.get(PLUGIN)(),
             BertForMaskedLM("megatron-bert", **CONFIGS["megatron-bert"]), None)


@probe(AREA)
def megatron_add_model_config_parser(api: Api) -> None:
    registry = api.get("utils.dataclasses.MODEL_CONFIGS_TO_MEGATRON_PARSERS")
    before = dict(registry)
    try:
        def parse_tiny(plugin, model, batch_data):
            plugin.megatron_lm_default_args["tiny"] = model.config.size
            return "parsed"

        decorated = api.call("register a parser", "utils.dataclasses.add_model_config_to_megatron_parser", "tiny")
        wrapper = api.observe("decorate", decorated, parse_tiny)
        api.observe("the wrapper's name", lambda: wrapper.__name__)
        api.observe("the registered parser is the function", lambda: registry["tiny"] is parse_tiny)
        plugin = api.get(PLUGIN)()
        api.observe("call the wrapper", wrapper, plugin, SimpleNamespace(config=SimpleNamespace(size=3)), None)
        api.observe("set_network_size_args with it", plugin.set_network_size_args,
                    SimpleNamespace(config=SimpleNamespace(model_type="Tiny-Model", size=4)))
        api.record("tiny argument", plugin.megatron_lm_default_args.get("tiny"))
    finally:
        registry.clear()
        registry.update(before)
