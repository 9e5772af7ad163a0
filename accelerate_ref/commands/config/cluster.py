"""The choices ``accelerate config`` offers for a local machine or cluster (🤗 Accelerate 1.15's lists).

``config`` asks its questions on stdin (``config.get_user_input``); 🤗 Accelerate's
arrow-key version of them (``get_cluster_input``) is not reproduced.
"""

from ...utils.constants import (  # noqa: F401  (the option lists HF's config questions offer)
    DEEPSPEED_MULTINODE_LAUNCHERS,
    FSDP2_STATE_DICT_TYPE,
    FSDP_AUTO_WRAP_POLICY,
    FSDP_BACKWARD_PREFETCH,
    FSDP_SHARDING_STRATEGY,
    FSDP_STATE_DICT_TYPE,
    TORCH_DYNAMO_MODES,
)
from .config_utils import DYNAMO_BACKENDS  # noqa: F401
