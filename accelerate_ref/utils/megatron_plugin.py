"""`MegatronLMPlugin`: Megatron-LM's parallelism and training settings, validated as a dataclass.

Rule: every field HF accelerate 1.15 documents is accepted with its default;
a field left as None is read from the launcher's ``MEGATRON_LM_<FIELD>``
environment variable (``accelerate launch`` passes the config file's values
that way), else takes Megatron's default; degrees and micro batch counts are
positive ints, and sequence parallelism needs a tensor degree above 1. The
Megatron-LM engine itself (`megatron.training`, only in the Megatron-LM git
repository, CUDA only) is not run here: the Accelerator refuses the plugin,
naming the package. Catalog: plugin.unavailable_engines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .dataclasses import _check
from .environment import str_to_bool


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
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, f"{name} must be a positive int, got {value!r}")
        _check(not self.sequence_parallelism or self.tp_degree > 1, "sequence_parallelism needs tp_degree > 1")
        if self.consumed_samples is not None:
            # Megatron counts consumed samples for train, validation and test: missing ones start at 0.
            self.consumed_samples = list(self.consumed_samples) + [0] * (3 - len(self.consumed_samples))
