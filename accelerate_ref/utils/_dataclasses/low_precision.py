"""Low-precision types and FP8 recipes: `CustomDtype`, `FP8BackendType`, the FP8 recipe kwargs handlers.

Re-exported by `accelerate_ref.utils.dataclasses` (where HF keeps them). Each
recipe is plain data validated as HF 1.15 validates it; an unset field is read
from its ``ACCELERATE_FP8_*`` environment variable, else HF's default:

* `TERecipeKwargs` (TransformerEngine): ``use_autocast_during_eval``
  (USE_AUTOCAST_DURING_EVAL, False), ``margin`` (MARGIN, 0), ``interval``
  (INTERVAL, 1), ``fp8_format`` (FORMAT, "HYBRID"; upper-cased, one of
  HYBRID/E4M3/E5M2), ``amax_history_len`` (AMAX_HISTORY_LEN, 1024),
  ``amax_compute_algo`` (AMAX_COMPUTE_ALGO, "most_recent"; lower-cased, max or
  most_recent), ``override_linear_precision`` (OVERRIDE_FPROP/DGRAD/WGRAD, three
  False), ``use_mxfp8_block_scaling`` (USE_MXFP8_BLOCK_SCALING, False).
  Without TransformerEngine installed, construction is an ImportError (HF's).
* `MSAMPRecipeKwargs` (MS-AMP): ``opt_level`` (OPT_LEVEL, "O2"; O1 or O2).
* `AORecipeKwargs` (torchao): without a ``config``, a torchao
  ``Float8LinearConfig`` from ``pad_inner_dim`` (PAD_INNER_DIM, True) and
  ``enable_fsdp_float8_all_gather`` (ENABLE_FSDP_FLOAT8_ALL_GATHER, True).
  Without torchao, an ImportError.
* `FP8RecipeKwargs` (deprecated, a FutureWarning): ``backend`` (BACKEND, "MSAMP"
  where MS-AMP is installed, else "TE"; upper-cased, MSAMP or TE) and then the
  TransformerEngine rules above (HF runs only those: ``opt_level`` stays as given).

`fp8_backend_of` is the rule behind ``Accelerator.fp8_backend``.
Catalog: plugin.unavailable_engines.
"""

from __future__ import annotations

import enum
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Optional, get_args

from .base import KwargsHandler, check
from ..environment import parse_choice_from_env, parse_flag_from_env
from ..imports import is_msamp_available, is_torchao_available, is_transformer_engine_available

if TYPE_CHECKING:  # pragma: no cover - typing only
    from torchao.float8 import Float8LinearConfig

#: The prefix of the environment variables FP8 recipes read (written by ``accelerate launch --fp8_*``).
ENV_PREFIX = "ACCELERATE_FP8_"

Backend = Literal["MSAMP", "TE"]
OptLevel = Literal["O1", "O2"]
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]
AmaxComputeAlgorithm = Literal["max", "most_recent"]


class CustomDtype(enum.Enum):
    """Element types torch lacks, for sizing weights (`dtype_byte_size`, `infer_auto_device_map`'s ``special_dtypes``).

    Catalog: modeling.sizes.
    """

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


class FP8BackendType(str, enum.Enum):
    """The engine that runs FP8 training: NO (none), TE (TransformerEngine), MSAMP (MS-AMP), AO (torchao).

    Catalog: plugin.unavailable_engines.
    """

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


#: FP8 backend -> the package it needs.
FP8_BACKEND_PACKAGES = {"TE": "transformer_engine", "MSAMP": "msamp", "AO": "torchao"}


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(ENV_PREFIX + name, default))


def _one_of(value: str, choices: Any, field_name: str, end: str = "") -> str:
    """``value`` when it is one of the ``Literal`` ``choices``, else HF's ValueError (``end``: its final stop, or none)."""
    check(value in get_args(choices), f"`{field_name}` must be one of {' or '.join(get_args(choices))}{end}")
    return value


@dataclass
class AORecipeKwargs(KwargsHandler):
    """FP8 training with torchao: a ``Float8LinearConfig`` and which layers to convert (see module docstring).

    ``module_filter_func(module, fqn) -> bool`` picks the layers; None means
    `accelerate_ref.utils.ao.filter_linear_layers` without the first and last
    Linear. Catalog: plugin.unavailable_engines.
    """

    config: Optional["Float8LinearConfig"] = None
    module_filter_func: Optional[Callable] = None
    pad_inner_dim: Optional[bool] = None
    enable_fsdp_float8_all_gather: Optional[bool] = None

    def __post_init__(self) -> None:
        if not is_torchao_available():
            raise ImportError("TorchAO is not available. Please install it or use a different backend.")
        if self.config is not None:
            return
        from torchao.float8 import Float8LinearConfig

        if self.pad_inner_dim is None:
            self.pad_inner_dim = parse_flag_from_env(ENV_PREFIX + "PAD_INNER_DIM", default=True)
        if self.enable_fsdp_float8_all_gather is None:
            self.enable_fsdp_float8_all_gather = parse_flag_from_env(ENV_PREFIX + "ENABLE_FSDP_FLOAT8_ALL_GATHER", default=True)
        self.config = Float8LinearConfig(
            pad_inner_dim=self.pad_inner_dim, enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather
        )


@dataclass
class TERecipeKwargs(KwargsHandler):
    """FP8 training with TransformerEngine's delayed-scaling (or MXFP8 block-scaling) recipe (see module docstring).

    Catalog: plugin.unavailable_engines.
    """

    use_autocast_during_eval: Optional[bool] = None
    margin: Optional[int] = None
    interval: Optional[int] = None
    fp8_format: FP8Format = None
    amax_history_len: Optional[int] = None
    amax_compute_algo: AmaxComputeAlgorithm = None
    override_linear_precision: tuple[bool, bool, bool] = None
    use_mxfp8_block_scaling: Optional[bool] = None

    def __post_init__(self) -> None:
        self._fill_transformer_engine_fields()

    def _fill_transformer_engine_fields(self) -> None:
        if not is_transformer_engine_available():
            raise ImportError("TransformerEngine is not available. Please install it or use a different backend.")
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = parse_flag_from_env(ENV_PREFIX + "USE_AUTOCAST_DURING_EVAL")
        if self.margin is None:
            self.margin = _env_int("MARGIN", 0)
        if self.interval is None:
            self.interval = _env_int("INTERVAL", 1)
        if self.fp8_format is None:
            self.fp8_format = os.environ.get(ENV_PREFIX + "FORMAT", "HYBRID")
        self.fp8_format = _one_of(self.fp8_format.upper(), FP8Format, "fp8_format", end=".")
        if self.amax_compute_algo is None:
            self.amax_compute_algo = os.environ.get(ENV_PREFIX + "AMAX_COMPUTE_ALGO", "most_recent")
        self.amax_compute_algo = _one_of(self.amax_compute_algo.lower(), AmaxComputeAlgorithm, "amax_compute_algo")
        if self.amax_history_len is None:
            self.amax_history_len = _env_int("AMAX_HISTORY_LEN", 1024)
        if self.override_linear_precision is None:
            self.override_linear_precision = tuple(
                parse_flag_from_env(ENV_PREFIX + f"OVERRIDE_{gemm}") for gemm in ("FPROP", "DGRAD", "WGRAD")
            )
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = parse_flag_from_env(ENV_PREFIX + "USE_MXFP8_BLOCK_SCALING")


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """FP8 training with MS-AMP at optimisation level ``opt_level`` (see module docstring).

    Catalog: plugin.unavailable_engines.
    """

    opt_level: OptLevel = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = os.environ.get(ENV_PREFIX + "OPT_LEVEL", "O2")
        _one_of(self.opt_level, OptLevel, "opt_level")


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated (a FutureWarning): one recipe for TE or MS-AMP, picked by ``backend`` (see module docstring).

    Rule: an unknown ``backend`` is a ValueError naming it, before the
    TransformerEngine rules run. Catalog: plugin.unavailable_engines.
    """

    backend: Backend = None

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated and will be removed in Accelerate v2.0.0. "
            "Please use one of the proper FP8 recipe kwargs classes such as TERecipeKwargs or MSAMPRecipeKwargs instead.",
            FutureWarning,
        )
        if self.backend is None:
            self.backend = os.environ.get(ENV_PREFIX + "BACKEND", "msamp" if is_msamp_available() else "te")
        self.backend = self.backend.upper()
        check(
            self.backend in get_args(Backend),
            "`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use `FP8RecipeKwargs`.",
        )
        self._fill_transformer_engine_fields()


#: Recipe class -> the backend it selects (FP8RecipeKwargs names its own), in HF's order of precedence.
_RECIPE_BACKENDS = ((AORecipeKwargs, FP8BackendType.AO), (TERecipeKwargs, FP8BackendType.TE), (MSAMPRecipeKwargs, FP8BackendType.MSAMP))
#: The kwargs handlers that are FP8 recipes.
FP8_RECIPE_CLASSES = (FP8RecipeKwargs,) + tuple(recipe for recipe, _ in _RECIPE_BACKENDS)


def fp8_backend_of(kwargs_handlers: Mapping[type, Any], deepspeed_plugin: Any = None) -> FP8BackendType:
    """The FP8 backend an Accelerator with these handlers uses (``Accelerator.fp8_backend``).

    Rule (HF 1.15): an `FP8RecipeKwargs` gives its ``backend``; else an
    `AORecipeKwargs`, `TERecipeKwargs` or `MSAMPRecipeKwargs` (in that order)
    gives AO, TE or MSAMP; else a DeepSpeed plugin with ``enable_msamp`` gives
    MSAMP; else ``ACCELERATE_FP8_BACKEND`` (default "NO"; an unknown value is a
    ValueError). ``kwargs_handlers`` maps each handler's class to the handler.
    Catalog: plugin.unavailable_engines.
    """
    recipe = kwargs_handlers.get(FP8RecipeKwargs)
    if recipe is not None:
        return FP8BackendType(recipe.backend)
    for recipe_class, backend in _RECIPE_BACKENDS:
        if kwargs_handlers.get(recipe_class) is not None:
            return backend
    if deepspeed_plugin is not None and getattr(deepspeed_plugin, "enable_msamp", False):
        return FP8BackendType.MSAMP
    return FP8BackendType(parse_choice_from_env("ACCELERATE_FP8_BACKEND", "NO"))
