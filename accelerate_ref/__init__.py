"""A readable reference implementation of the documented 🤗 Accelerate API.

Names and import paths mirror the real library, so a script switches by
changing one import: ``from accelerate_ref import Accelerator``.
"""

from ._lazy import lazy_exports

__version__ = "0.1.0"

#: Public name -> (module, attribute), imported on first use (see accelerate_ref._lazy).
_EXPORTS = {
    "Accelerator": (".accelerator", "Accelerator"),
    "skip_first_batches": (".data_loader", "skip_first_batches"),
    "AcceleratorState": (".state", "AcceleratorState"),
    "GradientState": (".state", "GradientState"),
    "PartialState": (".state", "PartialState"),
    "AutocastKwargs": (".utils.dataclasses", "AutocastKwargs"),
    "DataLoaderConfiguration": (".utils.dataclasses", "DataLoaderConfiguration"),
    "DistributedDataParallelKwargs": (".utils.dataclasses", "DistributedDataParallelKwargs"),
    "DistributedType": (".utils.dataclasses", "DistributedType"),
    "GradientAccumulationPlugin": (".utils.dataclasses", "GradientAccumulationPlugin"),
    "GradScalerKwargs": (".utils.dataclasses", "GradScalerKwargs"),
    "InitProcessGroupKwargs": (".utils.dataclasses", "InitProcessGroupKwargs"),
    "ProfileKwargs": (".utils.dataclasses", "ProfileKwargs"),
    "ProjectConfiguration": (".utils.dataclasses", "ProjectConfiguration"),
    "find_executable_batch_size": (".utils.memory", "find_executable_batch_size"),
    "load_checkpoint_in_model": (".utils.modeling", "load_checkpoint_in_model"),
    "cpu_offload": (".big_modeling", "cpu_offload"),
    "cpu_offload_with_hook": (".big_modeling", "cpu_offload_with_hook"),
    "disk_offload": (".big_modeling", "disk_offload"),
    "dispatch_model": (".big_modeling", "dispatch_model"),
    "init_empty_weights": (".big_modeling", "init_empty_weights"),
    "init_on_device": (".big_modeling", "init_on_device"),
    "load_checkpoint_and_dispatch": (".big_modeling", "load_checkpoint_and_dispatch"),
    "infer_auto_device_map": (".utils.modeling", "infer_auto_device_map"),
    "prepare_pippy": (".inference", "prepare_pippy"),
    "debug_launcher": (".launchers", "debug_launcher"),
    "notebook_launcher": (".launchers", "notebook_launcher"),
    "DeepSpeedPlugin": (".utils.dataclasses", "DeepSpeedPlugin"),
    "FullyShardedDataParallelPlugin": (".utils.dataclasses", "FullyShardedDataParallelPlugin"),
    "synchronize_rng_states": (".utils.random", "synchronize_rng_states"),
    # Issue 13 (engine internals): HF exports the comm hook enum at the top level too.
    "DDPCommunicationHookType": (".utils.dataclasses", "DDPCommunicationHookType"),
    "ParallelismConfig": (".parallelism_config", "ParallelismConfig"),
}
__all__ = [
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "find_executable_batch_size",
    "load_checkpoint_in_model",
    "skip_first_batches",
    "prepare_pippy",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "debug_launcher",
    "notebook_launcher",
    "DeepSpeedPlugin",
    "FullyShardedDataParallelPlugin",
    "synchronize_rng_states",
    "DDPCommunicationHookType",
    "ParallelismConfig",
]
# --- launch parity ---
_EXPORTS["is_rich_available"] = (".utils.imports", "is_rich_available")
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
