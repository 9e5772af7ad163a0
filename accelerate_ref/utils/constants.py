"""File names and other constants used when saving and loading.

Catalog: constants.names, save_state.file_names, save_model.default,
save_model.sharded.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

# Accelerator.save_state() file names (catalog save_state.file_names).
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"
FSDP_MODEL_NAME = "pytorch_model_fsdp"

# FSDP option names (HF 1.15's lists: the plugin and `accelerate config` take these, by name or 1-based index)
# and the torch versions FSDP (1) and FSDP2 (``fully_shard``) need. Catalog: plugin.fsdp, plugin.fsdp_strategies.
FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
FSDP_PYTORCH_VERSION = "2.1.0.a0+32f93b1"  # HF's value: 2.1.0, spelled as the pre-release MS-AMP's image ships
FSDP2_PYTORCH_VERSION = "2.6.0"

# Accelerator.save_model() file names (catalog save_model.default, save_model.sharded).
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = MODEL_NAME + "{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = SAFE_MODEL_NAME + "{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"

# Accelerator.profile() trace files (catalog profile.context).
PROFILE_PATTERN_NAME = "profile_{suffix}.json"

# torch.compile modes accepted by TorchDynamoPlugin (catalog plugin.dynamo).
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]

# Comparison operators accepted by compare_versions / is_torch_version (catalog env.checks).
STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}

# Torch versions from which the XPU and MTIA profilers exist (HF 1.15's names, MITA spelling kept).
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"

# DistributedType values (as strings) that run torch.distributed on CUDA, and all that run
# torch.distributed collectives at all (HF 1.15's lists; `utils.operations` and `utils.random`
# re-export them).
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = CUDA_DISTRIBUTED_TYPES + [
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "MULTI_CPU",
    "MULTI_HPU",
    "MULTI_NEURON",
]


def _upcastable_layers() -> tuple[type, ...]:
    import torch

    nn = torch.nn
    return (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)


# Layer classes whose weights layerwise casting upcasts for compute (HF 1.15's tuple).
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = _upcastable_layers()

# Version floors of N-D parallelism (HF 1.15's names): DTensor's public home, the torch tensor-
# and context-parallel APIs, transformers' tensor-parallel plans, DeepSpeed's sequence parallelism.
DTENSOR_PYTORCH_VERSION = "2.5.0"
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"

# --- Launcher constants (HF 1.15's utils.constants; catalog launch.cli) ---
# Versions a SageMaker config names by default, and the EC2 instances that run SageMaker's
# model-parallel jobs (config files only: launching on SageMaker needs AWS).
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_PYTHON_VERSION = "py38"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PARALLEL_EC2_INSTANCES = ["ml.p3.16xlarge", "ml.p3dn.24xlarge", "ml.p4dn.24xlarge"]
# DeepSpeed's multi-node launchers; `standard` means torch.distributed.run on every machine.
DEEPSPEED_MULTINODE_LAUNCHERS = ["pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm"]
# The torch version from which torch.distributed.run takes --log_line_prefix_template.
ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION = "2.2.0"
# The options of torch.distributed.run the launcher passes through to it.
TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path",
    "log_dir", "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port",
]
