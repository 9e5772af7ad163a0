"""`DeepSpeedPlugin` and `DeepSpeedSequenceParallelConfig`: the DeepSpeed dataclasses HF keeps in
``accelerate.utils.dataclasses`` (re-exported from there).

Rules (HF accelerate 1.15's, field for field):

* Unset fields take the launcher's environment (``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``,
  ``ACCELERATE_GRADIENT_CLIPPING``, ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ...) and then HF's
  defaults: accumulation steps and clipping "auto", stage 2, offload devices and NVMe paths
  "none", no 16-bit save, MS-AMP off at level O1.
* ``hf_ds_config`` (a dict, a JSON file path, base64 JSON text, or an `HfDeepSpeedConfig`) becomes
  an `HfDeepSpeedConfig`, whose dict is ``deepspeed_config`` (a missing or broken file escapes as
  its ValueError); it needs a ``zero_optimization`` section. Its "auto" values take the plugin's
  fields; then the fields take the config's set values. Without a config (or with anything else,
  a ``pathlib.Path`` included, as HF's) one is built from the fields (the NVMe paths only for an
  "nvme" device). ``steps_per_print`` is infinite (DeepSpeed prints nothing). Field values are
  not checked (DeepSpeed checks its config).
* One deliberate difference from HF (catalog plugin.deepspeed_config): a field *given to the
  constructor* that contradicts a set config value is a ValueError naming the key (HF keeps the
  config's value silently); the environment's defaults only fill "auto".
* ``zero3_init_flag`` defaults to ``ACCELERATE_DEEPSPEED_ZERO3_INIT``, else whether the config
  is ZeRO-3; it is dropped, with a warning, for another stage.
* ``enable_msamp`` adds the config's ``msamp`` section (refused for ZeRO-3 or an opt level
  other than O1/O2, as HF); the Accelerator refuses it (`refuse_msamp`): MS-AMP needs CUDA.

Catalog: plugin.deepspeed_config, plugin.unavailable_engines.
"""

from __future__ import annotations

import copy
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .base import check
from ..environment import str_to_bool

#: Plugin field -> the dotted key of the DeepSpeed config it sets (HF's mapping).
DEEPSPEED_PLUGIN_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}

#: Launcher settings that a ``deepspeed_config_file`` replaces (HF refuses them together).
_CONFIG_FILE_REPLACES = (
    "gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
    "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path", "zero3_save_16bit_model",
    "mixed_precision",
)


@dataclass
class DeepSpeedPlugin:
    """A DeepSpeed configuration: a config (dict, JSON file or text) and the plugin's own fields.

    See the module docstring for the rules. `deepspeed_config_process`
    fills every "auto" value from keyword values (dotted keys) and refuses,
    naming them, set values that differ. Catalog: plugin.deepspeed_config.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: Optional[int] = None
    is_train_batch_min: bool = True
    offload_optimizer_device: Optional[str] = None
    offload_param_device: Optional[str] = None
    offload_optimizer_nvme_path: Optional[str] = None
    offload_param_nvme_path: Optional[str] = None
    zero3_init_flag: Optional[bool] = None
    zero3_save_16bit_model: Optional[bool] = None
    transformer_moe_cls_names: Optional[str] = None
    enable_msamp: Optional[bool] = None
    msamp_opt_level: Optional[str] = None

    def __post_init__(self) -> None:
        from ..deepspeed import HfDeepSpeedConfig

        given = {name for name in DEEPSPEED_PLUGIN_KEYS if getattr(self, name) is not None}
        self._fill_from_environment()
        if self.hf_ds_config is None:
            self.hf_ds_config = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
        config = self.hf_ds_config
        if isinstance(config, (dict, HfDeepSpeedConfig)) or (isinstance(config, str) and config != "none"):
            self._take_config(HfDeepSpeedConfig, given)
        else:
            self.hf_ds_config = HfDeepSpeedConfig(self._config_from_fields())
        self.deepspeed_config = self.hf_ds_config.config
        self.deepspeed_config["steps_per_print"] = float("inf")  # DeepSpeed prints nothing
        if self.zero3_init_flag is None:
            flag = os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT", str(self.hf_ds_config.is_zero3()))
            self.zero3_init_flag = str_to_bool(flag) == 1
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn("DeepSpeed Zero3 Init flag is only applicable for ZeRO Stage 3. Setting it to False.")
            self.zero3_init_flag = False
        #: Whether this is the plugin `prepare` uses (one of ``Accelerator(deepspeed_plugins=...)``); see `select`.
        self._selected = False
        if self.enable_msamp and "msamp" not in self.deepspeed_config:
            if self.zero_stage == 3:
                raise NotImplementedError("MS-AMP is not supported for ZeRO Stage 3. Please use ZeRO Stage 0, 1, or 2 instead.")
            check(self.msamp_opt_level in ("O1", "O2"), "Invalid optimization level for MS-AMP. Please use one of ['O1' or'O2'].")
            self.deepspeed_config["msamp"] = {"enabled": True, "opt_level": self.msamp_opt_level}

    def _fill_from_environment(self) -> None:
        """Unset fields from the launcher's environment, else HF's defaults."""
        if self.gradient_accumulation_steps is None:
            steps = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "auto")
            self.gradient_accumulation_steps = int(steps) if steps.isdigit() else steps
        if self.gradient_clipping is None:
            clipping = os.environ.get("ACCELERATE_GRADIENT_CLIPPING", "auto")
            self.gradient_clipping = clipping if clipping == "auto" else float(clipping)
        if self.zero_stage is None:
            self.zero_stage = int(os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"))
        for name in ("offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path", "offload_param_nvme_path"):
            if getattr(self, name) is None:
                setattr(self, name, os.environ.get(f"ACCELERATE_DEEPSPEED_{name.upper()}", "none"))
        if self.zero3_save_16bit_model is None:
            self.zero3_save_16bit_model = os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", "false").lower() == "true"
        if self.enable_msamp is None:
            self.enable_msamp = os.environ.get("ACCELERATE_FP8_BACKEND") == "MSAMP"
        if self.msamp_opt_level is None:
            self.msamp_opt_level = os.environ.get("ACCELERATE_FP8_OPT_LEVEL", "O1")

    def _take_config(self, config_class: type, given: set[str]) -> None:
        """Read ``hf_ds_config``, fill its "auto" values from the fields, then the fields from its set values."""
        if not isinstance(self.hf_ds_config, config_class):
            self.hf_ds_config = config_class(self.hf_ds_config)
        config = self.hf_ds_config.config
        config.setdefault("gradient_accumulation_steps", 1)
        check("zero_optimization" in config, "Please specify the ZeRO optimization config in the DeepSpeed config.")
        self._deepspeed_config_checks()
        values = {key: getattr(self, name) for name, key in DEEPSPEED_PLUGIN_KEYS.items() if getattr(self, name) is not None}
        mismatches: list[str] = []
        for name, key in DEEPSPEED_PLUGIN_KEYS.items():
            if key in values:
                self.fill_match(key, mismatches, must_match=name in given, **values)
        _raise_mismatches(mismatches)
        self.hf_ds_config.set_stage_and_offload()
        for name, key in DEEPSPEED_PLUGIN_KEYS.items():
            value = self.hf_ds_config.get_value(key)
            if value is not None and value != "auto":
                setattr(self, name, value)

    def _config_from_fields(self) -> dict:
        """HF's config without ``hf_ds_config``: batch sizes "auto", the rest from the fields."""
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": {
                "stage": self.zero_stage,
                "offload_optimizer": {
                    "device": self.offload_optimizer_device,
                    "nvme_path": self.offload_optimizer_nvme_path if self.offload_optimizer_device == "nvme" else None,
                },
                "offload_param": {
                    "device": self.offload_param_device,
                    "nvme_path": self.offload_param_nvme_path if self.offload_param_device == "nvme" else None,
                },
                "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
            },
        }
        if self.gradient_clipping:
            config["gradient_clipping"] = self.gradient_clipping
        return config

    def _deepspeed_config_checks(self) -> None:
        """Refuse launcher settings that a DeepSpeed config file replaces (``ACCELERATE_CONFIG_DS_FIELDS``), as HF."""
        from_accelerate_config = os.environ.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",")
        if any(name in _CONFIG_FILE_REPLACES for name in from_accelerate_config):
            raise ValueError(
                f"When using `deepspeed_config_file`, the following accelerate config variables will be ignored: "
                f"{list(_CONFIG_FILE_REPLACES)}.\nPlease specify them appropriately in the DeepSpeed config file.\n"
                "If you are using an accelerate config file, remove others config variables mentioned in the above "
                "specified list.\nThe easiest method is to create a new config following the questionnaire via "
                "`accelerate config`.\nIt will only ask for the necessary config variables when using "
                "`deepspeed_config_file`."
            )

    # -- the config, by dotted key ------------------------------------------------------------

    def fill_match(self, ds_key_long: str, mismatches: Optional[list[str]] = None, must_match: bool = True, **kwargs: Any) -> None:
        """Fill "auto" at ``ds_key_long`` from ``kwargs`` (a ValueError where it is not there); with
        ``must_match``, append a set value that differs from ``kwargs``'s to ``mismatches``."""
        mismatches = [] if mismatches is None else mismatches
        node, leaf = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        if node.get(leaf) == "auto":
            if ds_key_long not in kwargs:
                raise ValueError(
                    f"`{ds_key_long}` not found in kwargs. Please specify `{ds_key_long}` without `auto` (set to correct "
                    "value) in the DeepSpeed config file or pass it in kwargs."
                )
            node[leaf] = kwargs[ds_key_long]
            return
        value = node.get(leaf)
        if must_match and value is not None and ds_key_long in kwargs and value != kwargs[ds_key_long]:
            mismatches.append(f"- ds {ds_key_long}={value} vs arg {ds_key_long}={kwargs[ds_key_long]}")

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config value at ``ds_key_long`` is "auto"."""
        return self.hf_ds_config.get_value(ds_key_long) == "auto"

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The config value at ``ds_key_long`` ("zero_optimization.stage"), or ``default``."""
        return self.hf_ds_config.get_value(ds_key_long, default)

    def deepspeed_config_process(
        self, prefix: str = "", mismatches: Optional[list[str]] = None, config: Optional[dict] = None, must_match: bool = True, **kwargs: Any
    ) -> None:
        """Fill every "auto" value of ``config`` (the plugin's, keys under ``prefix``) from ``kwargs``
        (dotted keys); at the top level refuse, naming them all, the set values that differ."""
        mismatches = [] if mismatches is None else mismatches
        config = self.deepspeed_config if config is None else config
        for key, value in config.items():
            if isinstance(value, dict):
                self.deepspeed_config_process(prefix + key + ".", mismatches, value, must_match, **kwargs)
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if prefix == "":
            _raise_mismatches(mismatches)

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Enable the config's ``fp16`` or ``bf16`` section (``bf16`` for fp8, plus ``msamp`` with `enable_msamp`).

        Rules (HF's): a section the config has is kept and only its "auto"
        ``enabled`` filled; the other precision enabled in the config is a
        ValueError; both sections exist afterwards. Catalog: plugin.deepspeed_config.
        """
        config = self.deepspeed_config
        enabled = {"fp16.enabled": mixed_precision == "fp16", "bf16.enabled": mixed_precision in ("bf16", "fp8")}
        if mixed_precision == "fp16":
            config.setdefault("fp16", {"enabled": True, "auto_cast": True})
        elif mixed_precision in ("bf16", "fp8"):
            config.setdefault("bf16", {"enabled": True})
        if mixed_precision == "fp8" and self.enable_msamp:
            config.setdefault("msamp", {"enabled": True, "opt_level": self.msamp_opt_level})
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if str(config.get(other, {}).get("enabled", "False")).lower() == "true":
                raise ValueError(
                    f"`--mixed_precision` arg cannot be set to `{mixed_precision}` when `{other}` is set in the DeepSpeed config file."
                )
        for dtype in ("fp16", "bf16"):
            config.setdefault(dtype, {"enabled": False})
        self.fill_match("fp16.enabled", must_match=False, **enabled)
        self.fill_match("bf16.enabled", must_match=False, **enabled)

    # -- transformers' view of the config (zero.Init) -----------------------------------------

    def set_deepspeed_weakref(self) -> None:
        """Register this config with transformers (``transformers.integrations.HfDeepSpeedConfig``), so that
        its ``from_pretrained`` builds ZeRO-3 models under ``deepspeed.zero.Init``.

        Rules (HF's): "auto" accumulation steps and micro batch size count as 1,
        an "auto" ``train_batch_size`` is left out. Needs transformers (ImportError
        naming it). Catalog: plugin.deepspeed_config.
        """
        from ..imports import is_transformers_available

        if not is_transformers_available():
            raise ImportError(
                "DeepSpeedPlugin.set_deepspeed_weakref registers the config with Transformers, which is not installed "
                "(pip install transformers)"
            )
        from transformers.integrations import HfDeepSpeedConfig as TransformersDeepSpeedConfig, unset_hf_deepspeed_config

        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, "auto") == "auto":
                config[key] = 1
        if config.get("train_batch_size") == "auto":
            del config["train_batch_size"]
        unset_hf_deepspeed_config()
        self.dschf = TransformersDeepSpeedConfig(config)  # transformers holds it by weak reference: keep it alive

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are built under ``deepspeed.zero.Init`` (``zero3_init_flag``)."""
        return self.zero3_init_flag

    @contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Within the block ``zero3_init_flag`` is ``enable`` (transformers told through
        `set_deepspeed_weakref`); restored after it. Nothing changes where it already is ``enable``."""
        old = self.zero3_init_flag
        if old == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.dschf = None
        self.set_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = old
            self.dschf = None
            self.set_deepspeed_weakref()

    def set_moe_leaf_modules(self, model: Any) -> None:
        """Mark the classes named in ``transformer_moe_cls_names`` (comma-separated; else
        ``ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES``) as ZeRO-3 leaf modules of ``model``
        (``deepspeed.utils.set_z3_leaf_modules``); a name not in the model is an error naming it."""
        if self.transformer_moe_cls_names is None:
            self.transformer_moe_cls_names = os.environ.get("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES")
        if self.transformer_moe_cls_names is None:
            return
        from .fsdp import get_module_class_from_name
        from ..versions import compare_versions

        if compare_versions("deepspeed", "<", "0.14.0"):  # not installed: importlib's PackageNotFoundError, as HF
            raise ImportError("DeepSpeed version must be >= 0.14.0 to use MOE support. Please update DeepSpeed.")
        from deepspeed.utils import set_z3_leaf_modules

        classes = []
        for name in self.transformer_moe_cls_names.split(","):
            found = get_module_class_from_name(model, name)
            if found is None:
                raise ValueError(f"Could not find a transformer layer class called '{name}' to wrap in the model.")
            classes.append(found)
        set_z3_leaf_modules(model, classes)

    # -- which of several plugins is active ---------------------------------------------------

    @property
    def selected(self) -> bool:
        """Whether `AcceleratorState.select_deepspeed_plugin` made this the active plugin. Catalog: plugin.deepspeed_config."""
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        raise NotImplementedError("'enabled' can only be set through calling 'AcceleratorState().enable_deepspeed_plugin(key)'.")

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this the active plugin; only `AcceleratorState.select_deepspeed_plugin` may (HF's rule and words).

        Where transformers is installed the config is registered with it
        (`set_deepspeed_weakref`), as HF does; without it nobody reads that registration.
        """
        if not _from_accelerator_state:
            raise ValueError(
                "A `DeepSpeedPlugin` object must be enabled manually by calling "
                "`AcceleratorState().enable_deepspeed_plugin(plugin_key)`."
            )
        from ..imports import is_transformers_available

        if is_transformers_available():
            self.set_deepspeed_weakref()
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False


def _raise_mismatches(mismatches: list[str]) -> None:
    if mismatches:
        raise ValueError(
            "Please correct the following DeepSpeed config values that mismatch kwargs  values:\n" + "\n".join(mismatches)
            + "\nThe easiest method is to set these DeepSpeed config values to 'auto'."
        )


def refuse_msamp(plugin: DeepSpeedPlugin) -> None:
    """Refuse, at `Accelerator(...)`, a plugin with ``enable_msamp``: MS-AMP (a CUDA-only package) is not
    installed (ImportError naming it), or it is and accelerate_ref does not drive it. Catalog: plugin.unavailable_engines."""
    if not plugin.enable_msamp:
        return
    from ..imports import is_msamp_available

    if not is_msamp_available():
        raise ImportError("DeepSpeedPlugin(enable_msamp=True) needs the `msamp` package (MS-AMP, CUDA only), which is not installed")
    raise NotImplementedError("DeepSpeedPlugin(enable_msamp=True): accelerate_ref does not drive MS-AMP yet (it is installed)")


#: Attention implementations DeepSpeed's Ulysses sequence parallelism runs on, and those it cannot.
SP_ATTN_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "sdpa")
SP_ATTN_UNSUPPORTED = ("eager", "flex_attention")


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed's Ulysses sequence parallelism (``ParallelismConfig(sp_backend="deepspeed", sp_handler=...)``).

    Rules (HF's): ``sp_seq_length_is_variable`` defaults to
    ``PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE`` (else True); a fixed length
    needs ``sp_seq_length`` (or ``PARALLELISM_CONFIG_SP_SEQ_LENGTH``: ValueError
    otherwise); ``sp_attn_implementation`` (default
    ``PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION``) is flash_attention_2/3, sdpa
    or a hub flash-attention kernel ("org/flash-attn..."), never eager or
    flex_attention (ValueError).
    """

    sp_seq_length: Optional[int] = None
    sp_seq_length_is_variable: Optional[bool] = None
    sp_attn_implementation: Optional[str] = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "true").lower() == "true"
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            length = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            check(
                length is not None,
                "when `sp_seq_length_is_variable` is `False` `sp_seq_length` must be provided either through the "
                "constructor or the environment variable PARALLELISM_CONFIG_SP_SEQ_LENGTH",
            )
            self.sp_seq_length = None if length == "None" else int(length)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        name = self.sp_attn_implementation
        if name is None:
            return
        check(
            name not in SP_ATTN_UNSUPPORTED,
            f"Invalid sp_attn_implementation: {name}. 'eager' and 'flex_attention' are not supported with sequence parallelism.",
        )
        check(
            name in SP_ATTN_IMPLEMENTATIONS or ("/" in name and "flash-attn" in name),
            f"Invalid sp_attn_implementation: {name}. Must be one of {list(SP_ATTN_IMPLEMENTATIONS)} or a hub-hosted "
            "flash attention kernel (e.g. 'kernels-community/flash-attn2').",
        )
