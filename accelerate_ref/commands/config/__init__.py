"""``accelerate-ref config``: the launcher's YAML config, read and written in 🤗 Accelerate's format."""

from .config_args import ClusterConfig, ConfigError, default_config_file, load_config_from_file
from .default import write_basic_config

__all__ = ["ClusterConfig", "ConfigError", "default_config_file", "load_config_from_file", "write_basic_config"]
