"""Where the launcher's config lives and what it may hold (🤗 Accelerate 1.15's ``config_args``).

Location (catalog ``launch.config_location``): ``$HF_HOME/accelerate``, else
``$XDG_CACHE_HOME/huggingface/accelerate``, else ``~/.cache/huggingface/accelerate``;
the file is ``default_config.yaml`` there. As in 🤗 Accelerate, the module
constants (``hf_cache_home``, ``cache_dir``, ``default_*_config_file``) are fixed
when the module is imported; the launcher and the ``config``/``env``/``test``
commands apply the rule again when they run (``current_default_config_file``),
so an ``HF_HOME`` set after the import still counts for them.

The keys are those of 🤗 Accelerate's ``default_config.yaml`` (catalog
``launch.config_file``): ``BaseConfig``, ``ClusterConfig`` and ``SageMakerConfig``
have its fields and defaults, so a file written by either tool is read by both
with equal fields. A file without ``distributed_type`` or with an unknown key is
refused with 🤗 Accelerate's ValueError and text (the unknown keys sorted, the
path as given); a file that is not a YAML (or JSON) mapping is a ``ConfigError``
(a ValueError saying so, where 🤗 Accelerate fails inside ``yaml`` or with an
AttributeError).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, Union

import yaml

from ...utils.constants import SAGEMAKER_PYTHON_VERSION, SAGEMAKER_PYTORCH_VERSION, SAGEMAKER_TRANSFORMERS_VERSION
from ...utils.dataclasses import ComputeEnvironment, DistributedType, SageMakerDistributedType


class ConfigError(ValueError):
    """A config file that is not a YAML (or JSON) mapping, or a config command without a file to work on."""


def current_cache_dir() -> str:
    """The folder of the default config by the location rule, read from the environment now."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.join(os.path.expanduser(hf_home), "accelerate")


def current_default_config_file() -> str:
    """The path ``launch`` reads when no ``--config_file`` is given (the location rule, applied now).

    Like 🤗 Accelerate, an old ``default_config.json`` is used when it is the only file there.
    """
    folder = current_cache_dir()
    yaml_file, json_file = os.path.join(folder, "default_config.yaml"), os.path.join(folder, "default_config.json")
    if os.path.isfile(json_file) and not os.path.isfile(yaml_file):
        return json_file
    return yaml_file


#: The location rule applied when this module was imported (🤗 Accelerate's module constants).
hf_cache_home = os.path.dirname(current_cache_dir())
cache_dir = current_cache_dir()
default_json_config_file = os.path.join(cache_dir, "default_config.yaml")
default_yaml_config_file = os.path.join(cache_dir, "default_config.yaml")
default_config_file = current_default_config_file()


def _read_mapping(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        try:
            values = json.load(handle) if path.endswith(".json") else yaml.safe_load(handle)
        except (yaml.YAMLError, json.JSONDecodeError) as error:
            reason = str(error).replace("\n", " ")
            raise ConfigError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'} ({reason})") from None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values, found {type(values).__name__}")
    return values


def load_config_from_file(config_file):
    """The config in ``config_file`` (the default file when None): a ``SageMakerConfig`` when its
    ``compute_environment`` is ``AMAZON_SAGEMAKER``, else a ``ClusterConfig``.

    A ``config_file`` that does not exist is a FileNotFoundError with 🤗 Accelerate's text.
    """
    if config_file is not None:
        if not os.path.isfile(config_file):
            raise FileNotFoundError(
                f"The passed configuration file `{config_file}` does not exist. Please pass an existing file to "
                "`accelerate launch`, or use the default one created through `accelerate config` and run "
                "`accelerate launch` without the `--config_file` argument."
            )
    else:
        config_file = default_config_file
    values = _read_mapping(config_file)
    sagemaker = values.get("compute_environment", ComputeEnvironment.LOCAL_MACHINE) != ComputeEnvironment.LOCAL_MACHINE
    config_class = SageMakerConfig if sagemaker else ClusterConfig
    if config_file.endswith(".json"):
        return config_class.from_json_file(json_file=config_file)
    return config_class.from_yaml_file(yaml_file=config_file)


def launch_config(config_file: str | None):
    """The config the launcher uses: ``config_file`` (which must exist), else the default file at the
    location resolved now when there is one, else None."""
    if config_file is None:
        config_file = current_default_config_file()
        if not os.path.isfile(config_file):
            return None
    elif not os.path.isfile(config_file):
        raise ConfigError(f"config file {config_file!r} does not exist")
    return load_config_from_file(config_file)


def _serialisable(value: Any) -> Any:
    """Enums as their values; an empty section as None (left out of the file); sections recursively."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _serialisable(item) for key, item in value.items()} or None
    return value


@dataclass
class BaseConfig:
    """The fields every launch config has; ``compute_environment`` and ``distributed_type`` become enums."""

    compute_environment: ComputeEnvironment
    distributed_type: Union[DistributedType, SageMakerDistributedType]
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self):
        """The keys written to a file: enums as values, None and empty sections left out."""
        converted = {key: _serialisable(value) for key, value in self.__dict__.items()}
        return {key: value for key, value in converted.items() if value is not None}

    @staticmethod
    def process_config(config_dict):
        """Fill the keys a file may omit and convert old keys (``fp16``, ``dynamo_backend``); a file
        without ``distributed_type`` is refused."""
        if "compute_environment" not in config_dict:
            config_dict["compute_environment"] = ComputeEnvironment.LOCAL_MACHINE
        if "distributed_type" not in config_dict:
            raise ValueError("A `distributed_type` must be specified in the config file.")
        if "num_processes" not in config_dict and config_dict["distributed_type"] == DistributedType.NO:
            config_dict["num_processes"] = 1
        if "mixed_precision" not in config_dict:
            config_dict["mixed_precision"] = "fp16" if config_dict.get("fp16") else None
        config_dict.pop("fp16", None)
        if "dynamo_backend" in config_dict:
            backend = config_dict.pop("dynamo_backend")
            config_dict["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        for flag in ("use_cpu", "debug", "enable_cpu_affinity"):
            config_dict.setdefault(flag, False)
        return config_dict

    @classmethod
    def _from_mapping(cls, config_dict: dict[str, Any], path: str):
        """The config of ``config_dict`` read from ``path``; a key that is no field of ``cls`` is refused (all of
        them, sorted, in 🤗 Accelerate's words)."""
        config_dict = cls.process_config(config_dict)
        unknown = sorted(set(config_dict) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"The config file at {path} had unknown keys ({unknown}), please try upgrading your `accelerate` "
                "version or fix (and potentially remove) these keys from your config file."
            )
        return cls(**config_dict)

    @classmethod
    def from_json_file(cls, json_file=None):
        json_file = default_json_config_file if json_file is None else json_file
        return cls._from_mapping(_read_mapping(json_file), json_file)

    def to_json_file(self, json_file):
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_yaml_file(cls, yaml_file=None):
        yaml_file = default_yaml_config_file if yaml_file is None else yaml_file
        return cls._from_mapping(_read_mapping(yaml_file), yaml_file)

    def to_yaml_file(self, yaml_file):
        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)

    def __post_init__(self):
        if isinstance(self.compute_environment, str):
            self.compute_environment = ComputeEnvironment(self.compute_environment)
        if isinstance(self.distributed_type, str):
            sagemaker = self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
            self.distributed_type = (SageMakerDistributedType if sagemaker else DistributedType)(self.distributed_type)
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}


@dataclass
class ClusterConfig(BaseConfig):
    """A local machine's (or cluster's) launch settings; ``num_processes=-1`` means "not set"."""

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: Optional[str] = None
    main_process_ip: Optional[str] = None
    main_process_port: Optional[int] = None
    rdzv_backend: Optional[str] = "static"
    same_network: Optional[bool] = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: Optional[dict] = None
    deepspeed_config: Optional[dict] = None
    fsdp_config: Optional[dict] = None
    parallelism_config: Optional[dict] = None
    megatron_lm_config: Optional[dict] = None
    mpirun_config: Optional[dict] = None
    downcast_bf16: bool = False
    tpu_name: Optional[str] = None
    tpu_zone: Optional[str] = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: Optional[str] = None
    commands: list[str] = None
    tpu_vm: list[str] = None
    tpu_env: list[str] = None
    dynamo_config: Optional[dict] = None

    def __post_init__(self):
        for section in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "mpirun_config", "fp8_config", "parallelism_config"):
            if getattr(self, section) is None:
                setattr(self, section, {})
        return super().__post_init__()


@dataclass
class SageMakerConfig(BaseConfig):
    """An Amazon SageMaker training job's settings (read and written here; launching one needs AWS)."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: Optional[str] = None
    profile: Optional[str] = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = f"accelerate-sagemaker-{num_machines}"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: Optional[str] = None
    sagemaker_metrics_file: Optional[str] = None
    additional_args: Optional[dict] = None
    dynamo_config: Optional[dict] = None
    enable_cpu_affinity: bool = False
