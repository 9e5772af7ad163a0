"""What is installed and which devices are usable on this machine.

Rule for every `is_<package>_available()` of a library: HF 1.15's answer
(`_is_package_available`): None when `importlib.util.find_spec` does not find
the package, True when it does and the package has installed metadata, False
for a bare folder of that name. Device packages count when found at all
(`_is_installed`), so stand-in packages put on `sys.path`, such as the
simulator's mock `torch_npu` and `torch_xla`, count. Device checks import the
device's package and ask torch only when called, never at import time.
Catalog: env.checks.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from typing import Any, Callable, Optional, TypeVar

from .environment import parse_flag_from_env, patch_environment
from .versions import is_torch_version


def _is_installed(name: str) -> bool:
    """Whether ``name`` can be imported (found without importing it); device stand-ins count."""
    return importlib.util.find_spec(name) is not None


def _is_package_available(name: str, metadata_name: Optional[str] = None) -> Optional[bool]:
    """HF's answer: None when ``name`` is not found, else whether its distribution (``metadata_name``) has metadata."""
    if not _is_installed(name):
        return None
    try:
        importlib.metadata.metadata(metadata_name or name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _torch() -> Any:
    import torch

    return torch


# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------
def is_cuda_available() -> bool:
    """True when torch sees a CUDA device (NVML-based check: CUDA stays uninitialised).

    Catalog: env.checks.
    """
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return _torch().cuda.is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """True when `torch_xla` is installed and not disabled with USE_TORCH_XLA=0.

    Rule: `check_is_tpu` / `check_is_gpu` additionally require the XLA
    runtime's device type to be TPU / GPU (asking both is a ValueError).
    Catalog: env.checks, xla.distributed_type.
    """
    if check_is_tpu and check_is_gpu:
        raise ValueError("check_is_tpu and check_is_gpu cannot both be true")
    if not parse_flag_from_env("USE_TORCH_XLA", default=True) or not _is_installed("torch_xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    runtime = importlib.import_module("torch_xla.runtime")
    device_type = runtime.device_type()
    return device_type == "TPU" if check_is_tpu else device_type in ("GPU", "CUDA")


def is_tpu_available(check_device: bool = True) -> bool:
    """True when `torch_xla` is installed and, with `check_device`, runs on a TPU.

    Catalog: env.checks.
    """
    return is_torch_xla_available(check_is_tpu=check_device)


def _device_module_usable(device: str, check_device: bool) -> bool:
    """True when `torch.<device>` exists and reports itself available.

    With `check_device`, devices are counted first; a RuntimeError means "none".
    """
    module = getattr(_torch(), device, None)
    if module is None:
        return False
    try:
        if check_device:
            module.device_count()
        return bool(module.is_available())
    except RuntimeError:
        return False


def _device_plugin_available(package: str, device: str, check_device: bool) -> bool:
    """True when the out-of-tree `package` imports and makes `torch.<device>` usable."""
    if not _is_installed(package):
        return False
    try:
        importlib.import_module(package)
    except Exception:  # a device package may fail to import on a machine without its hardware
        return False
    return _device_module_usable(device, check_device)


def is_npu_available(check_device: bool = False) -> bool:
    """True when `torch_npu` is installed and an NPU is available to torch.

    Catalog: env.checks, npu.distributed_type.
    """
    return _device_plugin_available("torch_npu", "npu", check_device)


def is_mlu_available(check_device: bool = False) -> bool:
    """True when `torch_mlu` is installed and an MLU is available to torch.

    Catalog: env.checks.
    """
    return _device_plugin_available("torch_mlu", "mlu", check_device)


def is_musa_available(check_device: bool = False) -> bool:
    """True when `torch_musa` is installed and a MUSA device is available to torch.

    Catalog: env.checks.
    """
    return _device_plugin_available("torch_musa", "musa", check_device)


def is_xpu_available(check_device: bool = False) -> bool:
    """True when stock torch (>= 2.7) sees an Intel XPU.

    Catalog: env.checks.
    """
    return is_torch_version(">=", "2.7") and _device_module_usable("xpu", check_device)


def is_mps_available(min_version: str = "1.12") -> bool:
    """True when torch (>= `min_version`) is built with Apple MPS and it is usable.

    Catalog: env.checks.
    """
    mps = _torch().backends.mps
    return is_torch_version(">=", min_version) and mps.is_available() and mps.is_built()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True when bf16 is supported by the device the processes would use.

    Rule: on a TPU, true unless `ignore_tpu`; on CUDA / XPU / MPS, what
    that device reports; on CPU, true.
    Catalog: env.checks, autocast.bf16.
    """
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    torch = _torch()
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    if is_xpu_available():
        return torch.xpu.is_bf16_supported()
    if is_mps_available():
        return torch.backends.mps.is_macos_or_newer(14, 0)
    return True


def is_fp8_available() -> bool:
    """True when an FP8 engine is installed (MS-AMP, TransformerEngine or torchao).

    Catalog: env.checks, plugin.unavailable_engines.
    """
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_torch_distributed_available() -> bool:
    """True when this torch build has `torch.distributed`.

    Catalog: env.checks.
    """
    return _torch().distributed.is_available()


# --------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------
def is_deepspeed_available() -> bool:
    """True when `deepspeed` is installed. Catalog: env.checks, plugin.unavailable_engines."""
    return _is_package_available("deepspeed")


def is_megatron_lm_available() -> bool:
    """True when `megatron` (Megatron-LM core) is installed. Catalog: env.checks, plugin.unavailable_engines."""
    return _is_package_available("megatron")


def is_msamp_available() -> bool:
    """True when `msamp` (MS-AMP) is installed. Catalog: env.checks, plugin.unavailable_engines."""
    return _is_package_available("msamp")


def is_transformer_engine_available() -> bool:
    """True when `transformer_engine` is installed (Intel's `intel_transformer_engine` on an HPU, as HF).

    Catalog: env.checks, plugin.unavailable_engines.
    """
    if is_hpu_available():
        return _is_package_available("intel_transformer_engine", "intel-transformer-engine")
    return _is_package_available("transformer_engine", "transformer-engine")


def is_torchao_available() -> bool:
    """True when `torchao` >= 0.6.1 (HF's minimum) is installed. Catalog: env.checks, plugin.unavailable_engines."""
    return bool(_is_package_available("torchao")) and _installed_at_least("torchao", "0.6.1")


def is_transformer_engine_mxfp8_available() -> bool:
    """True when TransformerEngine is installed and reports MXFP8 block scaling supported here.

    Rule (HF's): TransformerEngine's own ``check_mxfp8_support()`` decides;
    without the package, False. Catalog: env.checks.
    """
    if not _is_package_available("transformer_engine", "transformer-engine"):
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support

    return check_mxfp8_support()[0]


def _installed_at_least(distribution: str, min_version: str) -> bool:
    """Whether ``distribution`` is installed at ``min_version`` or later (read from its metadata)."""
    from .versions import compare_versions

    return compare_versions(distribution, ">=", min_version)


def is_bnb_available(min_version: Optional[str] = None) -> bool:
    """True when `bitsandbytes` is installed (at ``min_version`` or later, when given).

    Catalog: env.checks, plugin.unavailable_engines.
    """
    if not _is_package_available("bitsandbytes"):
        return False
    return min_version is None or _installed_at_least("bitsandbytes", min_version)


def is_8bit_bnb_available() -> bool:
    """True when `bitsandbytes` >= 0.37.2 (its 8-bit layers) is installed. Catalog: quantization.load_and_quantize."""
    return is_bnb_available("0.37.2")


def is_4bit_bnb_available() -> bool:
    """True when `bitsandbytes` >= 0.39.0 (its 4-bit layers) is installed. Catalog: quantization.load_and_quantize."""
    return is_bnb_available("0.39.0")


def is_bitsandbytes_multi_backend_available() -> bool:
    """True when the installed `bitsandbytes` lists "multi_backend" in its ``features`` (imports it).

    Catalog: env.checks.
    """
    if not is_bnb_available():
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_ipex_available() -> bool:
    """True when `intel_extension_for_pytorch` is installed. Catalog: env.checks."""
    return _is_package_available("intel_extension_for_pytorch")


# --------------------------------------------------------------------------
# Libraries
# --------------------------------------------------------------------------
def is_transformers_available() -> bool:
    """True when 🤗 `transformers` is installed. Catalog: env.checks, save.transformers_save_pretrained."""
    return _is_package_available("transformers")


def is_datasets_available() -> bool:
    """True when 🤗 `datasets` is installed. Catalog: env.checks."""
    return _is_package_available("datasets")


def is_peft_available() -> bool:
    """True when `peft` is installed. Catalog: env.checks."""
    return _is_package_available("peft")


def is_safetensors_available() -> bool:
    """True when `safetensors` is installed. Catalog: env.checks, save_model.default."""
    return _is_package_available("safetensors")


def is_torchvision_available() -> bool:
    """True when `torchvision` is installed. Catalog: env.checks."""
    return _is_package_available("torchvision")


def is_torchdata_available() -> bool:
    """True when `torchdata` is installed. Catalog: env.checks."""
    return _is_package_available("torchdata")


def is_tqdm_available() -> bool:
    """True when `tqdm` is installed. Catalog: env.checks."""
    return _is_package_available("tqdm")


def is_rich_available() -> bool:
    """True when `rich` is installed and enabled with ACCELERATE_ENABLE_RICH=1 (opt-in, as HF 1.15). Catalog: env.checks."""
    return bool(_is_package_available("rich")) and parse_flag_from_env("ACCELERATE_ENABLE_RICH", False)


# --------------------------------------------------------------------------
# Trackers (catalog tracking.init_log_end)
# --------------------------------------------------------------------------
def is_tensorboard_available() -> bool:
    """True when `tensorboard` or `tensorboardX` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("tensorboard") or _is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    """True when `wandb` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("wandb")


def is_comet_ml_available() -> bool:
    """True when `comet_ml` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("comet_ml")


def is_aim_available() -> bool:
    """True when `aim` < 4.0 is installed (HF's bound). Catalog: env.checks, tracking.init_log_end."""
    if _is_package_available("aim"):
        from .versions import compare_versions

        return compare_versions("aim", "<", "4.0.0")
    return False


def is_mlflow_available() -> bool:
    """True when `mlflow` is installed, as the full package or as `mlflow-skinny`. Catalog: env.checks,
    tracking.init_log_end."""
    return bool(_is_package_available("mlflow") or _is_package_available("mlflow", "mlflow-skinny"))


def is_clearml_available() -> bool:
    """True when `clearml` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("clearml")


def is_dvclive_available() -> bool:
    """True when `dvclive` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("dvclive")


# --------------------------------------------------------------------------
# The remaining checks of accelerate 1.15's `utils.imports` (catalog env.checks):
# same names and parameters, so a script's feature tests switch unchanged.
# --------------------------------------------------------------------------
USE_TORCH_XLA = parse_flag_from_env("USE_TORCH_XLA", default=True)


def is_pytest_available() -> bool:
    """True when `pytest` is installed. Catalog: env.checks."""
    return _is_package_available("pytest")


def is_pandas_available() -> bool:
    """True when `pandas` is installed. Catalog: env.checks."""
    return _is_package_available("pandas")


def is_matplotlib_available() -> bool:
    """True when `matplotlib` is installed. Catalog: env.checks."""
    return _is_package_available("matplotlib")


def is_timm_available() -> bool:
    """True when `timm` is installed. Catalog: env.checks."""
    return _is_package_available("timm")


def is_boto3_available() -> bool:
    """True when `boto3` is installed. Catalog: env.checks."""
    return _is_package_available("boto3")


def is_sagemaker_available() -> bool:
    """True when the `sagemaker` SDK is installed. Catalog: env.checks."""
    return _is_package_available("sagemaker")


def is_schedulefree_available() -> bool:
    """True when `schedulefree` is installed. Catalog: env.checks."""
    return _is_package_available("schedulefree")


def is_lomo_available() -> bool:
    """True when `lomo_optim` is installed. Catalog: env.checks."""
    return _is_package_available("lomo_optim")


def is_import_timer_available() -> bool:
    """True when `import_timer` is installed. Catalog: env.checks."""
    return _is_package_available("import_timer")


def is_pynvml_available() -> bool:
    """True when `pynvml` is installed with metadata of its own or of the `nvidia-ml-py` distribution that ships
    it (HF 1.15's two checks). Catalog: env.checks."""
    return _is_package_available("pynvml") or _is_package_available("pynvml", "nvidia-ml-py")


def is_amdsmi_available() -> bool:
    """True when `amdsmi` is installed. Catalog: env.checks."""
    return _is_package_available("amdsmi")


def is_swanlab_available() -> bool:
    """True when `swanlab` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("swanlab")


def is_trackio_available() -> bool:
    """True when `trackio` is installed. Catalog: env.checks, tracking.init_log_end."""
    return _is_package_available("trackio")


def is_triton_available() -> bool:
    """True when `triton` is installed. Catalog: env.checks."""
    return _is_package_available("triton")


def is_rocm_available() -> bool:
    """True when torch is a ROCm build and sees a device. Catalog: env.checks."""
    return _torch().version.hip is not None and is_cuda_available()


def is_xccl_available() -> bool:
    """True when torch.distributed has the XCCL backend (torch >= 2.7). Catalog: env.checks."""
    if not is_torch_version(">=", "2.7.0"):
        return False
    return bool(_torch().distributed.distributed_c10d.is_xccl_available())


def _has_device_package(package: str, check_device: bool, device_count: str) -> bool:
    """True when `package` is installed and, with `check_device`, `<package>.<device_count>()` finds one."""
    if not _is_installed(package):
        return False
    if not check_device:
        return True
    try:
        return getattr(importlib.import_module(package), device_count)() > 0
    except (RuntimeError, AttributeError):
        return False


def is_hpu_available(init_hccl: bool = False) -> bool:
    """True when Habana's `habana_frameworks.torch` is installed and torch sees an HPU. Catalog: env.checks."""
    if not _is_installed("habana_frameworks") or importlib.util.find_spec("habana_frameworks.torch") is None:
        return False
    importlib.import_module("habana_frameworks.torch")
    if init_hccl:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
    hpu = getattr(_torch(), "hpu", None)
    return bool(hpu is not None and hpu.is_available())


def is_habana_gaudi1() -> bool:
    """True on a first-generation Gaudi HPU (no fp16 there). Catalog: env.checks."""
    if not is_hpu_available():
        return False
    experimental = importlib.import_module("habana_frameworks.torch.utils.experimental")
    return experimental._get_device_type() == experimental.synDeviceType.synDeviceGaudi


def is_fp16_available() -> bool:
    """True everywhere except a Gaudi-1 HPU. Catalog: env.checks."""
    return not is_habana_gaudi1()


def is_sdaa_available(check_device: bool = False) -> bool:
    """True when `torch_sdaa` is installed (and, with `check_device`, sees a device). Catalog: env.checks."""
    return _has_device_package("torch_sdaa", check_device, "device_count")


def is_neuron_available(check_device: bool = False) -> bool:
    """True when `torch_neuronx` is installed (and, with `check_device`, sees a device). Catalog: env.checks."""
    return _has_device_package("torch_neuronx", check_device, "device_count")


def is_pippy_available() -> bool:
    """True when torch has `torch.distributed.pipelining` (torch >= 2.4). Catalog: env.checks."""
    return is_torch_version(">=", "2.4.0")


def is_weights_only_available() -> bool:
    """True when `torch.load(weights_only=True)` takes an allow-list (torch >= 2.4). Catalog: env.checks."""
    return is_torch_version(">=", "2.4.0")


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """True when numpy is installed at `min_version` or later. Catalog: env.checks."""
    from importlib import metadata

    from packaging.version import parse

    try:
        return parse(metadata.version("numpy")) >= parse(min_version)
    except metadata.PackageNotFoundError:
        return False


def is_torchdata_stateful_dataloader_available() -> bool:
    """True when `torchdata` >= 0.8 (with StatefulDataLoader) is installed. Catalog: env.checks."""
    from importlib import metadata

    from packaging.version import parse

    if not _is_package_available("torchdata"):
        return False
    return parse(metadata.version("torchdata")) >= parse("0.8.0")


def deepspeed_required(func: Any) -> Any:
    """Decorator: ``func`` runs only where the Accelerator drives DeepSpeed.

    Rule (HF's): once an `AcceleratorState` exists, a call while it has no
    `DeepSpeedPlugin` is a ValueError (HF's words); before any state exists
    the call goes through. Catalog: plugin.deepspeed_config.
    """
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..state import AcceleratorState

        shared = AcceleratorState._shared_state
        if shared and shared.get("deepspeed_plugins") is None:
            raise ValueError(
                "DeepSpeed is not enabled, please make sure that an `Accelerator` is configured for `deepspeed` "
                "before calling this function."
            )
        return func(*args, **kwargs)

    return wrapper


_Function = TypeVar("_Function", bound=Callable[..., Any])


def torchao_required(func: _Function) -> _Function:
    """Decorator: calling ``func`` without `torchao` installed raises ImportError (HF's words). Catalog: env.checks."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(
                "`torchao` is not available, please install it before calling this function via `pip install torchao`."
            )
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
