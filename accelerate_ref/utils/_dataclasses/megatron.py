"""`MegatronLMPlugin`: Megatron-LM's parallelism and training settings, and the model-config parsers.

Rules (HF accelerate 1.15's): every documented field is accepted with its
default, unchecked; a field left as None is read from the launcher's
``MEGATRON_LM_<FIELD>`` environment variable (``accelerate launch`` passes
the config file's values that way), else takes Megatron's default. The
plugin gathers Megatron's arguments in ``megatron_lm_default_args``; its
``set_*`` methods and the model-config parsers (``parse_*_config``, looked up
by model type in ``MODEL_CONFIGS_TO_MEGATRON_PARSERS``) fill in more of them
from the model, optimizer and scheduler. Only the tensorboard logging
options need Megatron-LM itself. The Megatron-LM engine (`megatron.training`,
only in the Megatron-LM git repository, CUDA only) is not run here: the
Accelerator refuses the plugin, naming the package.
Catalog: plugin.unavailable_engines.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..environment import str_to_bool

#: HF logs the GLM4 MoE parser from ``accelerate.utils.dataclasses``, where it defines the parsers.
logger = logging.getLogger("accelerate_ref.utils.dataclasses")


def _flag(text: str) -> bool:
    return str_to_bool(text) == 1


#: The fields that default to None and are then read from ``MEGATRON_LM_<FIELD>``: (parser, Megatron's default).
ENV_DEFAULTS: dict[str, tuple[Callable[[str], Any], Optional[str]]] = {
    "tp_degree": (int, "1"),
    "pp_degree": (int, "1"),
    "use_custom_fsdp": (_flag, "False"),
    "no_load_optim": (_flag, "False"),
    "eod_mask_loss": (_flag, "False"),
    "no_save_optim": (_flag, "False"),
    "optimizer_cpu_offload": (_flag, "False"),
    "overlap_cpu_optimizer_d2h_h2d": (_flag, "False"),
    "use_precision_aware_optimizer": (_flag, "False"),
    "decoder_last_pipeline_num_layers": (int, None),
    "num_micro_batches": (int, "1"),
    "gradient_clipping": (float, "1.0"),
    "recompute_activations": (_flag, "False"),
    "use_distributed_optimizer": (_flag, "False"),
    "sequence_parallelism": (_flag, "False"),
    "recompute_granularity": (str, "full"),
    "recompute_method": (str, "uniform"),
    "recompute_num_layers": (int, "1"),
    "attention_backend": (_flag, "True"),
    "expert_model_parallel_size": (int, "1"),
    "context_parallel_size": (int, "2"),
    "attention_dropout": (float, "0.0"),
    "hidden_dropout": (float, "0.0"),
    "attention_softmax_in_fp32": (_flag, "True"),
    "expert_tensor_parallel_size": (int, "1"),
    "calculate_per_token_loss": (_flag, "True"),
    "use_rotary_position_embeddings": (_flag, "True"),
}

#: Megatron argument -> the plugin field it is taken from, in HF's order (``megatron_lm_default_args``).
DEFAULT_ARGS_FROM_FIELDS = {
    "tensor_model_parallel_size": "tp_degree", "pipeline_model_parallel_size": "pp_degree",
    "pipeline_model_parallel_split_rank": "pipeline_model_parallel_split_rank",
    "num_layers_per_virtual_pipeline_stage": "num_layers_per_virtual_pipeline_stage", "DDP_impl": "DDP_impl",
    "use_distributed_optimizer": "use_distributed_optimizer", "sequence_parallel": "sequence_parallelism",
    "clip_grad": "gradient_clipping", "num_micro_batches": "num_micro_batches", "consumed_samples": "consumed_samples",
    "no_wd_decay_cond": "no_wd_decay_cond", "scale_lr_cond": "scale_lr_cond", "lr_mult": "lr_mult",
    "megatron_dataset_flag": "megatron_dataset_flag", "eval_iters": "eval_iters", "eval_interval": "eval_interval",
    **{name: name for name in (
        "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "no_save_optim", "optimizer_cpu_offload",
        "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
        "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
        "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings")},
}
#: Scheduler arguments `set_scheduler_args` copies from the plugin's fields (same names).
SCHEDULER_ARGS = ("train_iters", "lr_warmup_iters", "train_samples", "lr_warmup_samples", "lr_decay_iters",
                  "lr_decay_samples", "lr_warmup_fraction", "lr_decay_style", "weight_decay_incr_style",
                  "start_weight_decay", "end_weight_decay", "min_lr")


@dataclass
class MegatronLMPlugin:
    """Megatron-LM parallelism: tensor/pipeline degrees, micro batches, recomputation, schedules.

    Catalog: plugin.unavailable_engines (see the module docstring for the rule).
    """

    tp_degree: Optional[int] = None
    pp_degree: Optional[int] = None
    use_custom_fsdp: Optional[bool] = None
    overlap_cpu_optimizer_d2h_h2d: Optional[bool] = None
    no_load_optim: Optional[bool] = None
    eod_mask_loss: Optional[bool] = None
    no_save_optim: Optional[bool] = None
    optimizer_cpu_offload: Optional[bool] = None
    use_precision_aware_optimizer: Optional[bool] = None
    decoder_last_pipeline_num_layers: Optional[int] = None
    recompute_granularity: Optional[str] = None
    recompute_method: Optional[str] = None
    recompute_num_layers: Optional[int] = None
    attention_backend: Optional[bool] = None
    expert_model_parallel_size: Optional[int] = None
    context_parallel_size: Optional[int] = None
    attention_dropout: Optional[float] = None
    hidden_dropout: Optional[float] = None
    attention_softmax_in_fp32: Optional[bool] = None
    expert_tensor_parallel_size: Optional[int] = None
    calculate_per_token_loss: Optional[bool] = None
    use_rotary_position_embeddings: Optional[bool] = None
    num_micro_batches: Optional[int] = None
    gradient_clipping: Optional[float] = None
    sequence_parallelism: Optional[bool] = None
    recompute_activations: Optional[bool] = None
    use_distributed_optimizer: Optional[bool] = None
    pipeline_model_parallel_split_rank: Optional[int] = None
    num_layers_per_virtual_pipeline_stage: Optional[int] = None
    is_train_batch_min: str = True
    train_iters: Optional[int] = None
    train_samples: Optional[int] = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: Optional[float] = None
    end_weight_decay: Optional[float] = None
    lr_decay_style: str = "linear"
    lr_decay_iters: Optional[int] = None
    lr_decay_samples: Optional[int] = None
    lr_warmup_iters: Optional[int] = None
    lr_warmup_samples: Optional[int] = None
    lr_warmup_fraction: Optional[float] = None
    min_lr: float = 0
    consumed_samples: Optional[list[int]] = None
    no_wd_decay_cond: Optional[Callable] = None
    scale_lr_cond: Optional[Callable] = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: Optional[int] = None
    encoder_seq_length: Optional[int] = None
    decoder_seq_length: Optional[int] = None
    tensorboard_dir: Optional[str] = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Optional[Any] = None
    custom_train_step_kwargs: Optional[dict[str, Any]] = None
    custom_model_provider_function: Optional[Callable] = None
    custom_prepare_model_function: Optional[Callable] = None
    custom_megatron_datasets_provider_function: Optional[Callable] = None
    custom_get_batch_function: Optional[Callable] = None
    custom_loss_function: Optional[Callable] = None
    other_megatron_args: Optional[dict[str, Any]] = None

    def __post_init__(self) -> None:
        for name, (parse, default) in ENV_DEFAULTS.items():
            if getattr(self, name) is None:
                text = os.environ.get(f"MEGATRON_LM_{name.upper()}", default)
                setattr(self, name, None if text is None else parse(text))
        self.DDP_impl = "local" if self.pp_degree > 1 or self.use_distributed_optimizer else "torch"
        if self.consumed_samples is not None and len(self.consumed_samples) in (1, 2):
            # Megatron counts consumed samples for train, validation and test: missing ones start at 0 (in place, as HF).
            self.consumed_samples.extend([0] * (3 - len(self.consumed_samples)))
        self.megatron_lm_default_args = {arg: getattr(self, name) for arg, name in DEFAULT_ARGS_FROM_FIELDS.items()}
        if self.tensorboard_dir is not None:
            self.megatron_lm_default_args["tensorboard_dir"] = self.tensorboard_dir
            if self.set_all_logging_options:
                self.set_tensorboard_logging_options()
        if self.other_megatron_args is not None:
            self.megatron_lm_default_args.update(self.other_megatron_args)

    def set_network_size_args(self, model: Any, batch_data: Optional[dict] = None) -> None:
        """Fill the network-size arguments with the parser of the first registered model type that
        ``model.config.model_type`` contains; none is a ValueError naming the model type."""
        model_type = model.config.model_type.lower()
        for registered, parser in MODEL_CONFIGS_TO_MEGATRON_PARSERS.items():
            if registered in model_type:
                parser(self, model, batch_data)
                return
        raise ValueError(
            f"Accelerate Megatron-LM integration not supports {model_type} model. "
            "You can add your own model config parser."
        )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """fp16 sets Megatron's ``fp16``; bf16 sets ``bf16`` and the local DDP implementation; others nothing."""
        if mixed_precision == "fp16":
            self.megatron_lm_default_args["fp16"] = True
        elif mixed_precision == "bf16":
            self.megatron_lm_default_args["bf16"] = True
            self.DDP_impl = "local"
            self.megatron_lm_default_args["DDP_impl"] = self.DDP_impl

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Data-parallel degree and micro batch size; the global batch is their product times the micro batches."""
        self.data_parallel_size = dp_degree
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = dp_degree * micro_batch_size * self.num_micro_batches
        for name in ("data_parallel_size", "micro_batch_size", "global_batch_size"):
            self.megatron_lm_default_args[name] = getattr(self, name)

    def set_optimizer_type(self, optimizer: Any) -> None:
        """Megatron's optimizer arguments from a torch optimizer: an Adam (betas, eps) or an SGD (momentum) by
        class name, with its lr and weight decay; any other class is a ValueError naming it."""
        name = type(optimizer).__name__.lower()
        args, defaults = self.megatron_lm_default_args, optimizer.defaults
        if "adam" in name:
            args["optimizer"] = "adam"
            args["adam_beta1"], args["adam_beta2"] = defaults["betas"][0], defaults["betas"][1]
            args["adam_eps"] = defaults["eps"]
        elif "sgd" in name:
            args["optimizer"] = "sgd"
            args["sgd_momentum"] = defaults["momentum"]
        else:
            raise ValueError(f"Optimizer {name} is not supported by Megatron-LM")
        args["lr"] = defaults["lr"]
        args["weight_decay"] = defaults["weight_decay"]

    def set_scheduler_args(self, scheduler: Any) -> None:
        """Iteration counts from a scheduler's ``total_num_steps``/``warmup_num_steps`` (per data-parallel rank),
        unless given: then the sample counts are dropped, with a warning where they were set."""
        data_parallel_size = self.megatron_lm_default_args["data_parallel_size"]
        if self.train_iters is None:
            self.train_iters = scheduler.total_num_steps // data_parallel_size
            if self.train_samples is not None:
                self.train_samples = None
                warnings.warn("Ignoring `train_samples` as `train_iters` based on scheduler is being used for training.")
        if self.lr_warmup_iters is None:
            self.lr_warmup_iters = scheduler.warmup_num_steps // data_parallel_size
            if self.lr_warmup_samples is not None:
                warnings.warn(
                    "Ignoring `lr_warmup_samples` as `lr_warmup_iters` based on scheduler is being used for training."
                )
            self.lr_warmup_samples = 0
        self.megatron_lm_default_args.update({name: getattr(self, name) for name in SCHEDULER_ARGS})

    def set_tensorboard_logging_options(self) -> None:
        """Turn on every ``log_*`` option of Megatron's logging arguments (needs Megatron-LM's ``megatron.training``)."""
        from megatron.training.arguments import _add_logging_args

        parser = _add_logging_args(argparse.ArgumentParser())
        self.dataset_args = vars(parser.parse_known_args()[0])
        for key in self.dataset_args:
            if key.startswith("log_"):
                self.megatron_lm_default_args[key] = True
            elif key.startswith("no_log_"):
                self.megatron_lm_default_args[key.replace("no_", "")] = True


#: Model type (a substring of ``config.model_type``) -> the parser filling Megatron's network-size arguments.
MODEL_CONFIGS_TO_MEGATRON_PARSERS: dict[str, Callable] = {}


def add_model_config_to_megatron_parser(model_type: str) -> Callable[[Callable], Callable]:
    """Decorator registering a parser for ``model_type`` in ``MODEL_CONFIGS_TO_MEGATRON_PARSERS`` (the function
    itself is registered; the name is bound to a wrapper that calls it)."""

    def add_model_config_parser_helper(parser: Callable) -> Callable:
        @functools.wraps(parser)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return parser(*args, **kwargs)

        MODEL_CONFIGS_TO_MEGATRON_PARSERS[model_type] = parser
        return wrapper

    return add_model_config_parser_helper


def _sequence_length(plugin: MegatronLMPlugin, own: Optional[int], own_name: str, batch_data: Any,
                     default: int) -> None:
    """BERT's and GPT-2's rule: ``own`` (encoder/decoder length) wins over ``seq_length`` (with a warning when both
    are set, even as None), else the batch's length, else ``default``."""
    if plugin.seq_length is not None:
        if own is not None:
            warnings.warn(f"Both `seq_length` and `{own_name}` are set. Using `{own_name}`.")
        plugin.seq_length = own
    elif own is not None:
        plugin.seq_length = own
    elif batch_data is not None:
        plugin.seq_length = batch_data["input_ids"].shape[1]
    else:
        plugin.seq_length = default


def _decoder_only_sequence_length(plugin: MegatronLMPlugin, model: Any, batch_data: Any, default: int) -> None:
    """Llama's and GLM4-MoE's rule: unless set, the config's ``max_sequence_length``, else the decoder length,
    else the batch's length, else ``default``."""
    if plugin.seq_length is not None:
        return
    configured = getattr(model.config, "max_sequence_length", None)
    if configured is not None:
        plugin.seq_length = configured
    elif plugin.decoder_seq_length is not None:
        plugin.seq_length = plugin.decoder_seq_length
    elif batch_data is not None:
        plugin.seq_length = batch_data["input_ids"].shape[1]
    else:
        plugin.seq_length = default


def _network_size(plugin: MegatronLMPlugin, **values: Any) -> None:
    plugin.megatron_lm_default_args.update(values)


#: Megatron argument -> the config attribute Llama and GLM4-MoE read it from, in HF's reading order.
_DECODER_SIZES = dict(num_layers="num_hidden_layers", hidden_size="hidden_size",
                      num_attention_heads="num_attention_heads", orig_vocab_size="vocab_size",
                      max_position_embeddings="max_position_embeddings")


def _read(config: Any, **attributes: str) -> dict[str, Any]:
    """Megatron argument -> ``config``'s attribute, read in the given order (a missing one: AttributeError, as HF)."""
    return {argument: getattr(config, attribute) for argument, attribute in attributes.items()}


@add_model_config_to_megatron_parser("megatron-bert")
def parse_bert_config(megatron_lm_plugin: MegatronLMPlugin, model: Any, batch_data: Any) -> None:
    """BERT's sizes; pretraining when the model's class is a masked-LM one."""
    config = model.config
    sizes = _read(config, num_layers="num_hidden_layers", hidden_size="hidden_size",
                  num_attention_heads="num_attention_heads", max_position_embeddings="max_position_embeddings",
                  num_labels="num_labels", orig_vocab_size="vocab_size")
    _sequence_length(megatron_lm_plugin, megatron_lm_plugin.encoder_seq_length, "encoder_seq_length", batch_data,
                     sizes["max_position_embeddings"])
    _network_size(
        megatron_lm_plugin, seq_length=megatron_lm_plugin.seq_length, model_type_name="bert", **sizes,
        pretraining_flag="maskedlm" in type(model).__name__.lower(), model_return_dict=config.return_dict,
    )


@add_model_config_to_megatron_parser("gpt2")
def parse_gpt2_config(megatron_lm_plugin: MegatronLMPlugin, model: Any, batch_data: Any) -> None:
    """GPT-2's sizes (``n_layer``, ``n_embd``, ...), its BPE tokenizer, pretraining."""
    config = model.config
    sizes = _read(config, num_layers="n_layer", hidden_size="n_embd", num_attention_heads="n_head",
                  max_position_embeddings="n_positions", orig_vocab_size="vocab_size")
    _sequence_length(megatron_lm_plugin, megatron_lm_plugin.decoder_seq_length, "decoder_seq_length", batch_data,
                     sizes["max_position_embeddings"])
    _network_size(
        megatron_lm_plugin, seq_length=megatron_lm_plugin.seq_length, return_logits=megatron_lm_plugin.return_logits,
        tokenizer_type="GPT2BPETokenizer", model_type_name="gpt", **sizes, pretraining_flag=True,
        model_return_dict=config.return_dict,
    )


@add_model_config_to_megatron_parser("t5")
def parse_t5_config(megatron_lm_plugin: MegatronLMPlugin, model: Any, batch_data: Any) -> None:
    """T5's sizes; encoder and decoder lengths from the batch (``input_ids``, ``labels``), else ``n_positions``
    (1024 without it)."""
    config = model.config
    sizes = _read(config, num_layers="num_layers", hidden_size="d_model", num_attention_heads="num_heads")
    max_positions = config.n_positions if hasattr(config, "n_positions") else 1024
    sizes.update(max_position_embeddings=max_positions, orig_vocab_size=config.vocab_size)
    if megatron_lm_plugin.encoder_seq_length is None:
        megatron_lm_plugin.encoder_seq_length = (batch_data["input_ids"].shape[1] if batch_data is not None
                                                 else max_positions)
    if megatron_lm_plugin.decoder_seq_length is None:
        megatron_lm_plugin.decoder_seq_length = (batch_data["labels"].shape[1] if batch_data is not None
                                                 else max_positions)
    _network_size(
        megatron_lm_plugin, encoder_seq_length=megatron_lm_plugin.encoder_seq_length,
        decoder_seq_length=megatron_lm_plugin.decoder_seq_length, model_type_name="t5", **sizes,
        pretraining_flag=True, model_return_dict=config.return_dict,
    )


@add_model_config_to_megatron_parser("llama")
def parse_llama_config(megatron_lm_plugin: MegatronLMPlugin, model: Any, batch_data: Any) -> None:
    """Llama's sizes, its Llama2 tokenizer, pretraining."""
    config = model.config
    sizes = _read(config, **_DECODER_SIZES)
    _decoder_only_sequence_length(megatron_lm_plugin, model, batch_data, sizes["max_position_embeddings"])
    _network_size(
        megatron_lm_plugin, return_logits=megatron_lm_plugin.return_logits, tokenizer_type="Llama2Tokenizer",
        model_type_name="gpt", pretraining_flag=True, **sizes, seq_length=megatron_lm_plugin.seq_length,
        model_return_dict=config.return_dict,
    )


@add_model_config_to_megatron_parser("glm4_moe")
def parse_glm4_moe_config(megatron_lm_plugin: MegatronLMPlugin, model: Any, batch_data: Any) -> None:
    """GLM-4 MoE's sizes and Megatron's MoE, RoPE and normalisation settings for it (logged at INFO)."""
    config = model.config
    sizes = _read(config, **_DECODER_SIZES)
    _decoder_only_sequence_length(megatron_lm_plugin, model, batch_data, sizes["max_position_embeddings"])
    _network_size(
        megatron_lm_plugin, return_logits=megatron_lm_plugin.return_logits, tokenizer_type="HuggingFaceTokenizer",
        model_type_name="gpt", pretraining_flag=False, **sizes, kv_channels=config.head_dim,
        seq_length=megatron_lm_plugin.seq_length, model_return_dict=config.return_dict,
        position_embedding_type="rope", original_model_type=config.model_type, qk_layernorm=config.use_qk_norm,
        add_bias_linear=False, group_query_attention=True, num_query_groups=config.num_key_value_heads,
        ffn_hidden_size=config.intermediate_size, add_qkv_bias=True, normalization="RMSNorm",
        **{"rotary-percent": 0.5}, swiglu=True, moe_ffn_hidden_size=config.moe_intermediate_size,
        moe_shared_expert_intermediate_size=config.moe_intermediate_size, moe_router_pre_softmax=True,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0,
        moe_router_load_balancing_type="seq_aux_loss", moe_token_dispatcher_type="alltoall",
        moe_router_topk=config.num_experts_per_tok, moe_router_topk_scaling_factor=config.routed_scaling_factor,
        moe_layer_freq=[0] * config.first_k_dense_replace
        + [1] * (config.num_hidden_layers - config.first_k_dense_replace),
        num_experts=config.n_routed_experts, moe_grouped_gemm=True, moe_router_dtype="fp32", moe_permute_fusion=True,
        moe_aux_loss_coeff=0, rotary_base=config.rope_theta, rope_type="rope",
        rotary_percent=config.partial_rotary_factor, norm_epsilon=1e-3, use_flash_attn=True,
        eos_token_id=config.eos_token_id,
    )
    if getattr(config, "fp8_param", False):
        _network_size(megatron_lm_plugin, fp8=config.fp8, fp8_param=config.fp8_param,
                      fp8_param_gather=config.fp8_param_gather, fp8_recipe=config.fp8_recipe)
    _network_size(megatron_lm_plugin, bf16=config.bf16,
                  untie_embeddings_and_output_weights=not config.tie_word_embeddings)
    logger.info(f"Parsed GLM4 MoE config: {megatron_lm_plugin.megatron_lm_default_args}")
