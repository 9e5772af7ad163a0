"""`FullyShardedDataParallelPlugin`: how `Accelerator.prepare` shards a model with torch's FSDP.

Re-exported by `accelerate_ref.utils.dataclasses` (where HF keeps it). The fields, their defaults (``None``: read from the ``FSDP_*``
environment variables `accelerate-ref launch` sets, else HF's default) and their
normal forms are HF 1.15's: strategies, prefetch and state dict types become torch's
enums, ``auto_wrap_policy`` torch's wrap policy function, ``cpu_offload`` torch's
``CPUOffload`` (FSDP1) or ``OffloadPolicy`` (FSDP2), ``mixed_precision_policy``
torch's ``MixedPrecision`` / ``MixedPrecisionPolicy``. `utils.fsdp_utils` applies them
with ``fully_shard``.

Catalog: plugin.fsdp, plugin.fsdp_strategies, plugin.fsdp_state_dict, plugin.fsdp_wrap_policy.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import torch

from ..constants import FSDP2_PYTORCH_VERSION, FSDP_AUTO_WRAP_POLICY, FSDP_BACKWARD_PREFETCH, FSDP_SHARDING_STRATEGY
from ..environment import str_to_bool
from ..versions import is_torch_version

#: HF logs the plugin's FSDP2 notes from ``accelerate.utils.dataclasses``, where it defines the plugin.
logger = logging.getLogger("accelerate_ref.utils.dataclasses")

#: ``mixed_precision`` names -> the dtype FSDP computes in (HF's table: fp8 runs FSDP in bf16).
MIXED_PRECISION_DTYPES = {"fp8": torch.bfloat16, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

_ENV = "FSDP_"
#: The heading HF joins its FSDP2 notes with (``heading.join(notes)``: one note is logged alone).
_FSDP2_NOTES_HEADING = "Multiple deprecation warnings due to FSDP2 conversion:\n"


def _env_flag(name: str) -> bool:
    return str_to_bool(os.environ.get(_ENV + name, "False")) == 1


def _torch_enum(enum_class: Any, value: Any, field_name: str, names: Iterable[str] = ()) -> Any:
    """``value`` (a name of ``names`` in any case, a number or its digits, or a member name) as torch's ``enum_class``.

    Rule (HF's): a name of ``names`` is its position + 1, a number or digits
    are the member's value (an unknown one: torch's ValueError, as HF), anything
    else is looked up by member name. An unknown name is a KeyError, as in HF,
    but one that names ``field_name`` and the valid names (HF's is torch's bare
    ``KeyError('HALF')``): catalog plugin.unavailable_engines, whose case
    plugin_bad_sharding_strategy wants the field named.
    """
    names = list(names)
    if isinstance(value, str) and value.upper() in names:
        value = names.index(value.upper()) + 1
    if isinstance(value, int) or value.isdigit():
        return enum_class(int(value))
    try:
        return enum_class[value.upper()]
    except KeyError:
        valid = names or [member.name for member in enum_class]
        raise KeyError(f"{field_name} {value} is not one of {valid}") from None


def current_device() -> torch.device:
    """The device ``param_init_fn`` materialises meta modules on: the current accelerator's, else the CPU.

    HF refuses ``sync_module_states`` on a machine without an accelerator; torch's
    FSDP shards over gloo on the CPU, so accelerate_ref materialises there
    (catalog plugin.fsdp; a deviation listed in DIFFERENTIAL.toml).
    """
    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


@dataclass
class FullyShardedDataParallelPlugin:
    """How `prepare` shards a model with torch's FSDP; HF 1.15's fields, defaults and validation.

    Rules (HF's): ``fsdp_version`` (``FSDP_VERSION``, else 1) is 1 or 2
    (other values are taken as HF takes them: neither FSDP2's rules nor FSDP1's
    conversions apply). FSDP1: ``sharding_strategy`` a name (FULL_SHARD,
    SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2, any case) or the
    digits of its number becomes torch's ``ShardingStrategy`` (a non-string is
    kept as given); ``reshard_after_forward`` likewise, never a bool. FSDP2:
    ``reshard_after_forward`` a bool (default True), ``forward_prefetch`` and
    LOCAL_STATE_DICT refused; ``sharding_strategy``, ``backward_prefetch``,
    ``use_orig_params`` and ``sync_module_states`` noted in one warning log
    (``accelerate.utils.dataclasses``) and dropped. ``state_dict_type``
    FULL_STATE_DICT (FSDP1's default), LOCAL_STATE_DICT or SHARDED_STATE_DICT
    (FSDP2's default), with the matching torch state dict configs;
    ``auto_wrap_policy`` transformer_based_wrap, size_based_wrap or no_wrap (a
    non-string is kept as given); ``cpu_ram_efficient_loading`` forces
    ``sync_module_states`` under FSDP1; ``activation_checkpointing_offload``
    needs ``activation_checkpointing`` and FSDP2. An unknown name is a KeyError
    naming the field (`_torch_enum`). Catalog: plugin.fsdp, plugin.fsdp_strategies,
    plugin.fsdp_state_dict, plugin.fsdp_wrap_policy.
    """

    fsdp_version: int = None
    sharding_strategy: Union[str, Any] = None
    reshard_after_forward: Union[str, Any, bool] = None
    backward_prefetch: Optional[Union[str, Any]] = None
    mixed_precision_policy: Optional[Union[dict, str, Any]] = None
    auto_wrap_policy: Optional[Union[Callable, str]] = None
    cpu_offload: Union[bool, Any] = None
    ignored_modules: Optional[Union[Iterable[torch.nn.Module], str]] = None
    state_dict_type: Union[str, Any] = None
    state_dict_config: Optional[Any] = None
    optim_state_dict_config: Optional[Any] = None
    limit_all_gathers: bool = True
    use_orig_params: Optional[bool] = None
    param_init_fn: Optional[Callable[[torch.nn.Module], None]] = None
    sync_module_states: Optional[bool] = None
    forward_prefetch: bool = None
    activation_checkpointing: bool = None
    activation_checkpointing_offload: bool = None
    cpu_ram_efficient_loading: bool = None
    transformer_cls_names_to_wrap: Optional[list[str]] = None
    min_num_params: Optional[int] = None

    def __post_init__(self) -> None:
        from torch.distributed.fsdp import ShardingStrategy

        notes: set[str] = set()
        if self.fsdp_version is None:
            self.fsdp_version = int(os.environ.get(_ENV + "VERSION", "1"))
        if self.fsdp_version == 2 and not is_torch_version(">=", FSDP2_PYTORCH_VERSION):
            raise ImportError(f"FSDP2 requires PyTorch >= {FSDP2_PYTORCH_VERSION}")
        if self.sharding_strategy is not None:
            notes.add("sharding_strategy is deprecated in favor of reshard_after_forward. "
                      "This will be removed in a future version of Accelerate.")
        if self.fsdp_version == 1:
            if self.sharding_strategy is None:
                self.sharding_strategy = os.environ.get(_ENV + "SHARDING_STRATEGY", "FULL_SHARD")
            if isinstance(self.sharding_strategy, str):
                self.sharding_strategy = _torch_enum(ShardingStrategy, self.sharding_strategy, "sharding_strategy",
                                                     FSDP_SHARDING_STRATEGY)
        self._resolve_reshard_after_forward(ShardingStrategy)
        if self.cpu_offload is None:
            self.cpu_offload = _env_flag("OFFLOAD_PARAMS")
        self.set_cpu_offload()
        self.validate_cpu_offload()
        self._resolve_backward_prefetch(notes)
        self.set_state_dict_type()
        self._resolve_auto_wrap_policy()
        self._resolve_fsdp1_flags(notes)
        if self.activation_checkpointing is None:
            self.activation_checkpointing = _env_flag("ACTIVATION_CHECKPOINTING")
        if self.activation_checkpointing_offload is None:
            self.activation_checkpointing_offload = _env_flag("ACTIVATION_CHECKPOINTING_OFFLOAD")
        if self.activation_checkpointing_offload and not self.activation_checkpointing:
            raise ValueError("`activation_checkpointing_offload=True` requires `activation_checkpointing=True`.")
        if self.activation_checkpointing_offload and self.fsdp_version != 2:
            raise ValueError("`activation_checkpointing_offload=True` requires `fsdp_version=2`.")
        if self.ignored_modules is None:
            self.ignored_modules = os.environ.get(_ENV + "IGNORED_MODULES", None)
        if self.cpu_ram_efficient_loading is None:
            self.cpu_ram_efficient_loading = _env_flag("CPU_RAM_EFFICIENT_LOADING")
        else:  # transformers reads it to load weights on the first process only
            os.environ[_ENV + "CPU_RAM_EFFICIENT_LOADING"] = str(self.cpu_ram_efficient_loading)
        if self.fsdp_version == 1 and self.cpu_ram_efficient_loading and not self.sync_module_states:
            warnings.warn("sync_module_states cannot be False since efficient cpu ram loading enabled. Setting sync_module_states to True.")
            self.sync_module_states = True
        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)
        elif isinstance(self.mixed_precision_policy, dict):
            self.set_mixed_precision(self.mixed_precision_policy)
        if self.mixed_precision_policy is not None:
            self.validate_mixed_precision_policy()
        if self.sync_module_states:
            device = current_device()
            self.param_init_fn = lambda module: module.to_empty(device=device, recurse=False)
        if notes:
            logger.warning(_FSDP2_NOTES_HEADING.join(notes))

    def _resolve_reshard_after_forward(self, sharding_strategy_enum: Any) -> None:
        """HF's rule: a bool under FSDP2 (``FSDP_RESHARD_AFTER_FORWARD``, else True), a strategy under FSDP1."""
        if self.reshard_after_forward is None and self.sharding_strategy is None:
            self.reshard_after_forward = os.environ.get(_ENV + "RESHARD_AFTER_FORWARD", "true" if self.fsdp_version == 2 else "FULL_SHARD")
        if isinstance(self.reshard_after_forward, str):
            if self.fsdp_version == 2:
                self.reshard_after_forward = str_to_bool(self.reshard_after_forward.lower(), to_bool=True)
            else:
                self.reshard_after_forward = _torch_enum(sharding_strategy_enum, self.reshard_after_forward, "reshard_after_forward",
                                                         FSDP_SHARDING_STRATEGY)
        if self.fsdp_version == 2 and not isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"reshard_after_forward set to {self.reshard_after_forward}. This is not supported with FSDP2, please set to a `bool`"
            )
        if self.fsdp_version == 1 and isinstance(self.reshard_after_forward, bool):
            raise ValueError(
                f"reshard_after_forward set to {self.reshard_after_forward}. This is not supported with FSDP1, please set to a "
                "`str` or an instance of `torch.distributed.fsdp.fully_sharded_data_parallel.ShardingStrategy`"
            )

    def _resolve_backward_prefetch(self, notes: set[str]) -> None:
        """A name, number or digits become torch's ``BackwardPrefetch`` (NO_PREFETCH: None); FSDP2 drops it."""
        from torch.distributed.fsdp import BackwardPrefetch

        if self.backward_prefetch is None:
            self.backward_prefetch = os.environ.get(_ENV + "BACKWARD_PREFETCH", None)
        if isinstance(self.backward_prefetch, str) and self.backward_prefetch.upper() == "NO_PREFETCH":
            self.backward_prefetch = None
        if self.backward_prefetch is not None and not isinstance(self.backward_prefetch, BackwardPrefetch):
            self.backward_prefetch = _torch_enum(BackwardPrefetch, self.backward_prefetch, "backward_prefetch",
                                                 FSDP_BACKWARD_PREFETCH)
        if self.fsdp_version == 2 and self.backward_prefetch is not None:
            notes.add("backward_prefetch is not supported in FSDP2. Setting backward prefetch to None.")
            self.backward_prefetch = None

    def _resolve_auto_wrap_policy(self) -> None:
        """A policy name becomes torch's policy function (NO_WRAP: None), reading its option from the environment."""
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = os.environ.get(_ENV + "AUTO_WRAP_POLICY", "NO_WRAP")
        if not isinstance(self.auto_wrap_policy, str):
            return
        name = self.auto_wrap_policy.upper()
        if name not in FSDP_AUTO_WRAP_POLICY:
            raise ValueError(f"Invalid auto wrap policy: {self.auto_wrap_policy}. Must be one of {FSDP_AUTO_WRAP_POLICY}")
        if name == "TRANSFORMER_BASED_WRAP":
            self.auto_wrap_policy = transformer_auto_wrap_policy
            if self.transformer_cls_names_to_wrap is None:
                self.transformer_cls_names_to_wrap = os.environ.get(_ENV + "TRANSFORMER_CLS_TO_WRAP", None)
            if isinstance(self.transformer_cls_names_to_wrap, str):
                self.transformer_cls_names_to_wrap = self.transformer_cls_names_to_wrap.split(",")
        elif name == "SIZE_BASED_WRAP":
            self.auto_wrap_policy = size_based_auto_wrap_policy
            if self.min_num_params is None:
                self.min_num_params = int(os.environ.get(_ENV + "MIN_NUM_PARAMS", 0))
            elif not isinstance(self.min_num_params, int):
                raise ValueError(f"`min_num_params` must be an integer. Got {self.min_num_params} of type {type(self.min_num_params)}")
        else:
            self.auto_wrap_policy = None

    def _resolve_fsdp1_flags(self, notes: set[str]) -> None:
        """``use_orig_params``, ``sync_module_states`` and ``forward_prefetch``: FSDP1 options FSDP2 drops or refuses."""
        if self.use_orig_params is None and self.fsdp_version == 1:
            self.use_orig_params = _env_flag("USE_ORIG_PARAMS")
        if self.fsdp_version == 2 and self.use_orig_params is not None:
            notes.add("use_orig_params is obsolete in FSDP2, as FSDP2 always uses the original parameters.")
            self.use_orig_params = None
        if self.sync_module_states is None and self.fsdp_version == 1:
            self.sync_module_states = _env_flag("SYNC_MODULE_STATES")
        if self.fsdp_version == 2 and self.sync_module_states is not None:
            notes.add("sync_module_states is obsolete in FSDP2, as it is not needed anymore."
                      "Setting sync_module_states to None.")
            self.sync_module_states = None
        if self.forward_prefetch is None and self.fsdp_version == 1:
            self.forward_prefetch = _env_flag("FORWARD_PREFETCH")
        if self.fsdp_version == 2 and self.forward_prefetch is not None:
            raise ValueError("forward_prefetch is not yet implemented in FSDP2, set to None or use `fsdp_version=1`")

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Set ``state_dict_type`` (or keep it; ``FSDP_STATE_DICT_TYPE``, else FULL under FSDP1 and SHARDED under FSDP2)
        and fill unset ``state_dict_config``/``optim_state_dict_config`` with torch's matching configs (offloaded to
        the CPU; full ones on rank 0 only). FSDP2 refuses LOCAL_STATE_DICT. Catalog: plugin.fsdp_state_dict.
        """
        from torch.distributed.fsdp.fully_sharded_data_parallel import (
            FullOptimStateDictConfig,
            FullStateDictConfig,
            ShardedOptimStateDictConfig,
            ShardedStateDictConfig,
            StateDictType,
        )

        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        if self.state_dict_type is None:
            default = "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT"
            self.state_dict_type = os.environ.get(_ENV + "STATE_DICT_TYPE", default)
        if isinstance(self.state_dict_type, str):  # a member name or torch's number (not FSDP_STATE_DICT_TYPE's order)
            self.state_dict_type = _torch_enum(StateDictType, self.state_dict_type, "state_dict_type")
        if self.state_dict_type == StateDictType.FULL_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)
        elif self.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            if self.state_dict_config is None:
                self.state_dict_config = ShardedStateDictConfig(offload_to_cpu=True)
            if self.optim_state_dict_config is None:
                self.optim_state_dict_config = ShardedOptimStateDictConfig(offload_to_cpu=True)
        if self.fsdp_version == 2 and self.state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise ValueError(
                "FSDP2 does not support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or `FULL_STATE_DICT`."
            )

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Bind torch's wrap policy to ``model``: the transformer policy to the classes named in
        ``transformer_cls_names_to_wrap`` (default: the model's ``_no_split_modules``; an absent class is a ValueError
        naming it), the size policy to ``min_num_params`` (0: no wrapping). Catalog: plugin.fsdp_wrap_policy.
        """
        from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

        if self.auto_wrap_policy == transformer_auto_wrap_policy:
            if self.transformer_cls_names_to_wrap is None:
                self.transformer_cls_names_to_wrap = list(getattr(model, "_no_split_modules", None) or [])
            self.auto_wrap_policy = functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls=transformer_classes(model, self.transformer_cls_names_to_wrap)
            )
        elif self.auto_wrap_policy == size_based_auto_wrap_policy:
            self.auto_wrap_policy = (
                functools.partial(size_based_auto_wrap_policy, min_num_params=self.min_num_params) if self.min_num_params > 0 else None
            )

    def set_mixed_precision(self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False) -> None:
        """Set ``mixed_precision_policy`` from ``mixed_precision`` (fp8, fp16, bf16, fp32 or one of their dtypes)
        where it is unset (or always with ``override``): torch's ``MixedPrecision`` (FSDP1; buffers in float32 with
        ``buffer_autocast``) or ``MixedPrecisionPolicy`` (FSDP2). A dict policy is checked (every key of the version,
        dtype values) and converted. An unknown precision is a ValueError.
        """
        dtype = mixed_precision
        if isinstance(mixed_precision, str):
            dtype = MIXED_PRECISION_DTYPES.get(mixed_precision)
            if dtype is None:
                raise ValueError(f"Invalid mixed precision: {mixed_precision}. Must be one of {list(MIXED_PRECISION_DTYPES)}")
        elif isinstance(mixed_precision, torch.dtype) and mixed_precision not in MIXED_PRECISION_DTYPES.values():
            raise ValueError(f"Invalid mixed precision: {mixed_precision}. Must be one of {list(MIXED_PRECISION_DTYPES.values())}")
        policy_class = _mixed_precision_class(self.fsdp_version)
        last_key = "buffer_dtype" if self.fsdp_version == 1 else "output_dtype"
        if override or self.mixed_precision_policy is None:
            last_value = (torch.float32 if buffer_autocast else dtype) if self.fsdp_version == 1 else dtype
            self.mixed_precision_policy = policy_class(param_dtype=dtype, reduce_dtype=dtype, **{last_key: last_value})
        elif isinstance(self.mixed_precision_policy, dict):
            valid_keys = ["param_dtype", "reduce_dtype", last_key]
            missing = [key for key in valid_keys if key not in self.mixed_precision_policy]
            invalid = [key for key, value in self.mixed_precision_policy.items() if value not in MIXED_PRECISION_DTYPES.values()]
            if missing or invalid:
                raise ValueError(
                    f"Invalid mixed precision policy: {self.mixed_precision_policy}. Must be a `dict` with keys {valid_keys}."
                    f"Values must be one of {list(MIXED_PRECISION_DTYPES.values())}"
                )
            self.mixed_precision_policy = policy_class(**self.mixed_precision_policy)

    def validate_mixed_precision_policy(self) -> None:
        """Refuse (ValueError) a ``mixed_precision_policy`` that is not torch's class for this ``fsdp_version``."""
        if not isinstance(self.mixed_precision_policy, _mixed_precision_class(self.fsdp_version)):
            required = "MixedPrecisionPolicy" if self.fsdp_version == 2 else "MixedPrecision"
            raise ValueError(f"mixed_precision_policy must be an instance of `torch.distributed.fsdp.{required}`.")

    def set_cpu_offload(self) -> None:
        """A bool ``cpu_offload`` becomes torch's ``CPUOffload(offload_params=...)`` (FSDP1) or
        ``CPUOffloadPolicy()`` / ``OffloadPolicy()`` (FSDP2)."""
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        if isinstance(self.cpu_offload, bool):
            if self.fsdp_version == 2:
                self.cpu_offload = CPUOffloadPolicy() if self.cpu_offload else OffloadPolicy()
            else:
                self.cpu_offload = CPUOffload(offload_params=self.cpu_offload)

    def validate_cpu_offload(self) -> None:
        """Refuse (ValueError) a ``cpu_offload`` that is not torch's class for this ``fsdp_version``."""
        from torch.distributed.fsdp import CPUOffload, OffloadPolicy

        if self.fsdp_version == 2 and not isinstance(self.cpu_offload, OffloadPolicy):
            raise ValueError(f"`cpu_offload` must be an instance of `torch.distributed.fsdp.OffloadPolicy` in FSDP2, got {self.cpu_offload}")
        if self.fsdp_version == 1 and not isinstance(self.cpu_offload, CPUOffload):
            raise ValueError(f"`cpu_offload` must be an instance of `torch.distributed.fsdp.CPUOffload` in FSDP1, got {self.cpu_offload}")


def _mixed_precision_class(fsdp_version: int) -> type:
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    return MixedPrecisionPolicy if fsdp_version == 2 else MixedPrecision


def get_module_class_from_name(module: Any, name: str) -> Optional[type]:
    """The class named ``name`` among ``module`` (an ``nn.Module``) and its descendants, or None.

    Catalog: plugin.fsdp_wrap_policy.
    """
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None


def transformer_classes(model: torch.nn.Module, class_names: Iterable[str]) -> set[type]:
    """The classes named in ``class_names`` found in ``model``; an absent one is a ValueError naming it.

    Catalog: plugin.fsdp_wrap_policy.
    """
    classes = set()
    for class_name in class_names:
        found = get_module_class_from_name(model, class_name)
        if found is None:
            raise ValueError(f"Could not find the transformer layer class {class_name} in the model.")
        classes.add(found)
    return classes
