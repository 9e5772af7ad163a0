"""A readable reference implementation of the documented 🤗 Accelerate API.

Names and import paths mirror the real library, so a script switches by
changing one import: ``from accelerate_ref import Accelerator``.
"""

from .accelerator import Accelerator
from .data_loader import skip_first_batches
from .state import AcceleratorState, GradientState, PartialState
from .utils.dataclasses import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    ProjectConfiguration,
)
from .utils.memory import find_executable_batch_size
from .utils.modeling import load_checkpoint_in_model
from .big_modeling import (  # big-model inference (issue 10)
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from .utils.modeling import infer_auto_device_map
from .inference import prepare_pippy  # pipeline-parallel inference (issue 13)

__version__ = "0.1.0"

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
    # pipeline-parallel inference (issue 13)
    "prepare_pippy",
    # big-model inference (issue 10)
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
]

# -- launching (issue 11) --
from .launchers import debug_launcher, notebook_launcher  # noqa: E402

__all__ += ["debug_launcher", "notebook_launcher"]

# Engine plugins (catalog "Plugins and engines").
from .utils.dataclasses import DeepSpeedPlugin, FullyShardedDataParallelPlugin  # noqa: E402

__all__ += ["DeepSpeedPlugin", "FullyShardedDataParallelPlugin"]

# -- issue 13 follow-up: HF 1.15's top-level re-export of the RNG synchronisation --
from .utils.random import synchronize_rng_states  # noqa: E402

__all__ += ["synchronize_rng_states"]
