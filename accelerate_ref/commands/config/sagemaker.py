"""The choices ``accelerate config`` offers for Amazon SageMaker (🤗 Accelerate 1.15's lists).

A SageMaker config file is read and written (``config_args.SageMakerConfig``); the
questions that make one (``get_sagemaker_input``) and launching on SageMaker need AWS.
"""

from ...utils.constants import SAGEMAKER_PARALLEL_EC2_INSTANCES, TORCH_DYNAMO_MODES  # noqa: F401
from .config_utils import DYNAMO_BACKENDS  # noqa: F401
