"""Utilities of the reference implementation, mirroring `accelerate.utils`.

No module here imports `accelerate_ref.state` at import time (the collective
operations import it inside their functions), so `state.py` can import from
`accelerate_ref.utils` without a cycle.
"""

from .constants import (
    FSDP_MODEL_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    PROFILE_PATTERN_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TORCH_DYNAMO_MODES,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)
from .dataclasses import (
    AutocastKwargs,
    BaseEnum,
    ComputeEnvironment,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    LoggerType,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    SageMakerDistributedType,
    TensorInformation,
    TorchDynamoPlugin,
)
from .environment import (
    clear_environment,
    get_int_from_env,
    parse_flag_from_env,
    patch_environment,
    str_to_bool,
)
from .imports import (
    is_aim_available,
    is_bf16_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_ipex_available,
    is_megatron_lm_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_msamp_available,
    is_musa_available,
    is_npu_available,
    is_peft_available,
    is_rich_available,
    is_safetensors_available,
    is_tensorboard_available,
    is_torch_distributed_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_available,
    is_torchvision_available,
    is_tpu_available,
    is_tqdm_available,
    is_transformer_engine_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)
from .memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size
from .modeling import (
    checkpoint_files,
    convert_file_size_to_int,
    dtype_byte_size,
    load_checkpoint_in_model,
    load_state_dict,
    shard_checkpoint,
)
from .operations import (
    ConvertOutputsToFp32,
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    get_data_structure,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    listify,
    pad_across_processes,
    pad_input_tensors,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)
from .other import extract_model_from_parallel, is_compiled_module
from .random import set_seed, synchronize_rng_state, synchronize_rng_states
from .serialization import clean_state_dict_for_safetensors, fsync_directory, load, save, write_atomically
from .versions import compare_versions, is_torch_version

# -- launching (issue 11) --
from .launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env  # noqa: E402
from .torch_xla import install_xla  # noqa: E402
from ..commands.config.default import write_basic_config  # noqa: E402

# Issue 13 (API parity with accelerate 1.15): the remaining names HF's `accelerate.utils` exports.
from .environment import (  # noqa: E402
    CPUInformation,
    are_libraries_initialized,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_current_device_type,
    parse_choice_from_env,
    purge_accelerate_environment,
)
from .imports import (  # noqa: E402
    is_amdsmi_available,
    is_boto3_available,
    is_fp16_available,
    is_habana_gaudi1,
    is_hpu_available,
    is_import_timer_available,
    is_lomo_available,
    is_matplotlib_available,
    is_neuron_available,
    is_numpy_available,
    is_pandas_available,
    is_pippy_available,
    is_pynvml_available,
    is_pytest_available,
    is_rocm_available,
    is_sagemaker_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_timm_available,
    is_torchdata_stateful_dataloader_available,
    is_trackio_available,
    is_triton_available,
    is_weights_only_available,
    is_xccl_available,
)
from .operations import CannotPadNestedTensorWarning, copy_tensor_to_devices  # noqa: E402
from .other import (  # noqa: E402
    check_os_kernel,
    convert_bytes,
    get_module_children_bottom_up,
    get_pretty_name,
    merge_dicts,
    recursive_getattr,
    wait_for_everyone,
)

# -- big-model inference (issue 10): sizes, placement, offload ----------------------
from .modeling import (  # noqa: E402
    align_module_device,
    calculate_maximum_sizes,
    check_device_map,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    compute_module_total_buffer_size,
    find_tied_parameters,
    get_balanced_memory,
    get_grad_scaler,
    get_max_layer_size,
    get_max_memory,
    get_mixed_precision_context_manager,
    has_offloaded_params,
    id_tensor_storage,
    infer_auto_device_map,
    is_peft_model,
    load_offloaded_weights,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from .offload import (  # noqa: E402
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)

# Engines and plugins (catalog "Plugins and engines").
from .dataclasses import (  # noqa: E402
    BnbQuantizationConfig,
    DDPCommunicationHookType,
    DeepSpeedPlugin,
    FP8RecipeKwargs,
    FullyShardedDataParallelPlugin,
    MegatronLMPlugin,
    get_module_class_from_name,
)
from .fsdp_utils import load_fsdp_model, load_fsdp_optimizer, merge_fsdp_weights, save_fsdp_model, save_fsdp_optimizer  # noqa: E402
from .bnb import load_and_quantize_model  # noqa: E402
from .deepspeed import (  # noqa: E402  (HF re-exports these only where deepspeed is installed; here always)
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
    map_pytorch_optim_to_deepspeed,
)

# Issue 13 follow-up: HF 1.15's remaining constants re-exported by `accelerate.utils`.
from .constants import (  # noqa: E402
    MITA_PROFILING_AVAILABLE_PYTORCH_VERSION,
    TORCH_DISTRIBUTED_OPERATION_TYPES,
    XPU_PROFILING_AVAILABLE_PYTORCH_VERSION,
)
from .operations import GatheredParameters  # noqa: E402
from .environment import check_cuda_p2p_ib_support, get_gpu_info, set_numa_affinity  # noqa: E402
