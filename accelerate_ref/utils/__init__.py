"""Utilities of the reference implementation, mirroring `accelerate.utils`.

Every module here imports `accelerate_ref.state` lazily (inside functions),
so `state.py` can import from `accelerate_ref.utils` without a cycle.
"""

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
    TorchDynamoPlugin,
)
from .environment import (
    clear_environment,
    get_int_from_env,
    parse_flag_from_env,
    patch_environment,
    str_to_bool,
)
