"""The choices ``accelerate config`` offers for a local machine or cluster (🤗 Accelerate 1.15's lists).

``config`` asks its questions on stdin (``config.get_user_input``); 🤗 Accelerate's
arrow-key version of them (``get_cluster_input``) is not reproduced.
"""

from ...utils.constants import DEEPSPEED_MULTINODE_LAUNCHERS, TORCH_DYNAMO_MODES  # noqa: F401
from .config_utils import DYNAMO_BACKENDS  # noqa: F401
