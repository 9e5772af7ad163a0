"""Where the launcher's config lives and what it may hold.

Location (catalog ``launch.config_location``): ``$HF_HOME/accelerate``, else
``$XDG_CACHE_HOME/huggingface/accelerate``, else ``~/.cache/huggingface/accelerate``;
the file is ``default_config.yaml`` there. The keys are those of 🤗 Accelerate's
``default_config.yaml`` (catalog ``launch.config_file``), so a file written by
either tool is read by both; an unknown key or a file that is not a YAML
mapping is a ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file that cannot be used (missing, malformed, unknown keys)."""


def cache_dir() -> str:
    """The folder of the default config, by the location rule (read from the environment now)."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.join(os.path.expanduser(hf_home), "accelerate")


def default_config_file() -> str:
    """The path ``launch`` reads when no ``--config_file`` is given."""
    return os.path.join(cache_dir(), "default_config.yaml")


@dataclass
class ClusterConfig:
    """One machine's (or cluster's) launch settings, field for field with 🤗 Accelerate's file."""

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    mixed_precision: str = "no"
    use_cpu: bool = False
    debug: bool = False
    num_processes: int = 1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = True
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict = field(default_factory=dict)
    deepspeed_config: dict = field(default_factory=dict)
    fsdp_config: dict = field(default_factory=dict)
    parallelism_config: dict = field(default_factory=dict)
    megatron_lm_config: dict = field(default_factory=dict)
    mpirun_config: dict = field(default_factory=dict)
    downcast_bf16: bool | str = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list | None = None
    tpu_vm: list | None = None
    tpu_env: list | None = None
    dynamo_config: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "config") -> "ClusterConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown}")
        return cls(**values)

    @classmethod
    def from_yaml_file(cls, path: str) -> "ClusterConfig":
        try:
            with open(path, encoding="utf-8") as handle:
                values = yaml.safe_load(handle)
        except yaml.YAMLError as error:
            reason = str(error).replace("\n", " ")
            raise ConfigError(f"{path}: not valid YAML ({reason})") from None
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of keys to values, found {type(values).__name__}")
        return cls.from_dict(values, where=path)

    def to_dict(self) -> dict[str, Any]:
        """The keys 🤗 Accelerate writes: every field that is set (empty sections and None left out)."""
        return {
            name: value
            for name, value in dataclasses.asdict(self).items()
            if value is not None and value != {} and value != []
        }

    def to_yaml_file(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)


def load_config_from_file(config_file: str | None) -> ClusterConfig | None:
    """The config at ``config_file`` (which must exist), else the default one if present, else None."""
    if config_file is not None:
        if not os.path.isfile(config_file):
            raise ConfigError(f"config file {config_file!r} does not exist")
        return ClusterConfig.from_yaml_file(config_file)
    path = default_config_file()
    return ClusterConfig.from_yaml_file(path) if os.path.isfile(path) else None
