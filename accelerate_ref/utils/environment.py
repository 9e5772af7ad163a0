"""Reading and temporarily changing the process environment.

Catalog: env.patch_environment, env.clear_environment.
Pure standard library: `accelerate_ref.state` imports this module, so it must
not import torch or anything from `accelerate_ref` itself.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

_logger = logging.getLogger(__name__)

_TRUE_STRINGS = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE_STRINGS = frozenset({"n", "no", "f", "false", "off", "0"})


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """Convert a truthy/falsy string to 1 or 0 (``True``/``False`` with ``to_bool``).

    Rule (HF's): case-insensitive, surrounding spaces included; "y", "yes",
    "t", "true", "on", "1" give 1 and "n", "no", "f", "false", "off", "0"
    give 0; anything else is a ValueError naming the lower-cased value
    (``invalid truth value maybe``). Returns an int (not a bool) unless
    ``to_bool``, as HF accelerate does.
    Catalog: env.checks (helper of the environment flags).
    """
    lowered = value.lower()
    if lowered in _TRUE_STRINGS:
        return True if to_bool else 1
    if lowered in _FALSE_STRINGS:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {lowered}")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Read the boolean flag `key` from the environment.

    Rule: an unset variable gives `default`; a set one goes through
    `str_to_bool` (so a malformed value is a ValueError, never silently False).
    Used for ACCELERATE_DEBUG_MODE and friends.
    Catalog: debug.shape_mismatch (reads ACCELERATE_DEBUG_MODE).
    """
    value = os.environ.get(key)
    if value is None:
        return default
    return str_to_bool(value) == 1


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """Return the first non-negative integer found among `env_keys`.

    Rule: keys are tried in order; unset keys and negative values are skipped;
    when none qualifies, `default` is returned.
    Catalog: env.checks.
    """
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Temporarily set environment variables.

    Rule: each keyword's name is upper-cased and its value converted with
    `str()`; on exit (also when the block raises) a variable that existed
    before gets its old value back and one that did not is removed.
    Catalog: env.patch_environment.
    """
    patched = {key.upper(): str(value) for key, value in kwargs.items()}
    previous = {key: os.environ.get(key) for key in patched}
    os.environ.update(patched)
    try:
        yield
    finally:
        for key, old_value in previous.items():
            if old_value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old_value


@contextmanager
def clear_environment() -> Iterator[None]:
    """Run a block with an empty `os.environ`.

    Rule: inside the block `os.environ` is empty; on exit (also when the
    block raises) the environment from before is restored exactly and every
    change made inside is discarded.
    Catalog: env.clear_environment.
    """
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --------------------------------------------------------------------------
# The remaining helpers of accelerate 1.15's `utils.environment` (catalog env.checks,
# env.patch_environment): same names and parameters.
# --------------------------------------------------------------------------
_FORBIDDEN_ENV_CHARACTERS = (";", "\n", "<", ">", " ")
_ACCELERATE_PREFIX = "ACCELERATE_"
_Wrapped = TypeVar("_Wrapped")


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The raw value of ``key`` in the environment, else ``str(default)``. Catalog: env.checks."""
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """The names among ``library_names`` already imported in this process. Catalog: env.checks."""
    return [name for name in library_names if name in sys.modules]


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """``["KEY=value\\n", ...]`` for the items safe to write to an environment file.

    Rule: an item whose key or value is empty or contains ``;``, a newline, ``<``,
    ``>`` or a space is skipped with a warning (it could inject a command).
    Catalog: env.checks.
    """
    lines = []
    for key, value in current_env.items():
        text = key + value
        if key and value and not any(char in text for char in _FORBIDDEN_ENV_CHARACTERS):
            lines.append(f"{key}={value}\n")
        else:
            _logger.warning(f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values.")
    return lines


@contextmanager
def _accelerate_variables_restored() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(_ACCELERATE_PREFIX)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_ACCELERATE_PREFIX)]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(function, "_accelerate_is_purged_environment_wrapped", False):
        return function

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _accelerate_variables_restored():
            return function(*args, **kwargs)

    wrapper._accelerate_is_purged_environment_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def purge_accelerate_environment(func_or_cls: _Wrapped) -> _Wrapped:
    """Decorator: the ``ACCELERATE_*`` variables a call sets (or changes) are undone when it returns.

    Rule: on a function, each call restores every ``ACCELERATE_*`` variable to its
    value before the call and removes new ones, even when the call raises. On a
    class, every ``test*`` method is wrapped so, including those of subclasses
    (test classes of unittest or pytest). Catalog: env.patch_environment.
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)  # type: ignore[arg-type,return-value]
    cls = func_or_cls

    def wrap_tests(klass: type) -> None:
        for name in dir(klass):
            method = getattr(klass, name)
            if name.startswith("test") and callable(method):
                setattr(klass, name, _purging(method))

    wrap_tests(cls)
    parent_hook = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(subclass: type, **kwargs: Any) -> None:
        if parent_hook is not None:
            parent_hook.__func__(subclass, **kwargs)
        else:
            super(cls, subclass).__init_subclass__(**kwargs)
        wrap_tests(subclass)

    cls.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    return cls  # type: ignore[return-value]


@dataclass
class CPUInformation:
    """Rank, world size, local rank and local world size of a CPU-distributed process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def get_cpu_distributed_information() -> CPUInformation:
    """The CPU launch's ranks, read from torchrun's or an MPI launcher's variables.

    Rule: each field is the first of torchrun's, Intel MPI's, Open MPI's and
    MVAPICH's variables that is set, else rank 0 of a one-process world.
    Catalog: env.checks.
    """
    return CPUInformation(
        rank=get_int_from_env(["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"], 0),
        local_world_size=get_int_from_env(
            ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"], 1),
    )


def get_current_device_type() -> tuple[str, str]:
    """``(device type, distributed type name)`` of this machine's accelerator, without initialising it.

    Rule: the first available of MLU, SDAA, MUSA, NPU, HPU, XPU, Neuron, else
    ``("cuda", "MULTI_GPU")``. Catalog: env.checks.
    """
    from . import imports

    for device, check in (("mlu", imports.is_mlu_available), ("sdaa", imports.is_sdaa_available),
                          ("musa", imports.is_musa_available), ("npu", imports.is_npu_available),
                          ("hpu", imports.is_hpu_available), ("xpu", imports.is_xpu_available),
                          ("neuron", imports.is_neuron_available)):
        if check():
            return device, f"MULTI_{device.upper()}"
    return "cuda", "MULTI_GPU"


# -- NVIDIA GPUs seen through nvidia-smi (HF 1.15's helpers; they never initialise CUDA) --------------


def _nvidia_smi() -> str:
    """The nvidia-smi command: on PATH, or on Windows its default install path when it is not."""
    import platform
    import shutil

    if platform.system() == "Windows" and shutil.which("nvidia-smi") is None:
        return f"{os.environ['systemdrive']}\\Program Files\\NVIDIA Corporation\\NVSMI\\nvidia-smi.exe"
    return "nvidia-smi"


def _query_gpus(field: str) -> list[str]:
    """One line of ``nvidia-smi --query-gpu=<field>`` per GPU (nvidia-smi's own errors propagate)."""
    import subprocess

    output = subprocess.check_output(
        [_nvidia_smi(), f"--query-gpu={field}", "--format=csv,noheader"], universal_newlines=True)
    return output.strip().split(os.linesep)


def get_gpu_info() -> tuple[list[str], int]:
    """``(names, count)`` of the machine's NVIDIA GPUs, from nvidia-smi, as HF 1.15."""
    gpus = _query_gpus("count,name")
    return [gpu.split(",")[1].strip() for gpu in gpus], len(gpus)


def get_driver_version() -> str:
    """The NVIDIA driver version (of the first GPU), from nvidia-smi, as HF 1.15."""
    return _query_gpus("driver_version")[0]


#: The first CUDA compute capability with FP8 tensor cores (Ada / Hopper).
_FP8_COMPUTE_CAPABILITY = (8, 9)


@functools.lru_cache
def check_cuda_fp8_capability() -> bool:
    """Whether the (first) NVIDIA GPU supports FP8: compute capability 8.9 or above.

    Rule (HF 1.15): the capability comes from ``nvidia-smi
    --query-gpu=compute_capability``; if that fails in any way, from
    ``torch.cuda.get_device_capability()`` (which initialises CUDA, and
    raises where torch has no CUDA). The answer is cached for the process,
    as HF's (``check_cuda_fp8_capability.cache_clear()`` forgets it). Catalog: env.checks.
    """
    try:
        capability = tuple(int(part) for part in _query_gpus("compute_capability")[0].split("."))
    except Exception:  # noqa: BLE001  (HF: any failure to ask nvidia-smi falls back to torch)
        import torch

        capability = torch.cuda.get_device_capability()
    return capability >= _FP8_COMPUTE_CAPABILITY


#: Consumer GPUs whose P2P/InfiniBand transfers need a fixed driver, and the first such driver.
_P2P_IB_UNSUPPORTED = ("RTX 40",)
_P2P_IB_FIXED_DRIVER = "550.40.07"


def check_cuda_p2p_ib_support() -> bool:
    """Whether NCCL may use P2P and InfiniBand on these GPUs.

    Rule (HF 1.15): False only with several GPUs of which one is an RTX 40xx
    and a driver older than 550.40.07; True otherwise, and True when
    nvidia-smi cannot answer.
    """
    from packaging.version import parse

    try:
        names, count = get_gpu_info()
        if count > 1 and any(bad in name for name in names for bad in _P2P_IB_UNSUPPORTED):
            return parse(get_driver_version()) >= parse(_P2P_IB_FIXED_DRIVER)
    except Exception:  # noqa: BLE001  (HF: any failure to ask means "supported")
        pass
    return True


def _parse_cpu_list(cpu_list: str) -> list[int]:
    """CPUs of a sysfs list such as ``"0-3,8"``."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in cpu_list.split(","))):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _gpu_cpu_affinity(local_process_index: int) -> list[int]:
    """The CPUs nearest to GPU ``local_process_index`` (amdsmi on ROCm, NVML on CUDA)."""
    import math

    from .imports import is_amdsmi_available, is_pynvml_available, is_rocm_available

    if is_rocm_available():
        if not is_amdsmi_available():
            raise ImportError("To set CPU affinity on ROCm GPUs the `amdsmi` package must be available. "
                              "It ships with ROCm; ensure the ROCm Python bindings are on PYTHONPATH.")
        import amdsmi

        amdsmi.amdsmi_init()
        try:
            node = amdsmi.amdsmi_topo_get_numa_node_number(amdsmi.amdsmi_get_processor_handles()[local_process_index])
            if node is None or node < 0:
                return list(os.sched_getaffinity(0))
            with open(f"/sys/devices/system/node/node{node}/cpulist") as cpulist:
                return _parse_cpu_list(cpulist.read())
        finally:
            amdsmi.amdsmi_shut_down()
    if not is_pynvml_available():
        raise ImportError("To set CPU affinity on CUDA GPUs the `nvidia-ml-py` package must be available. "
                          "(`pip install nvidia-ml-py`)")
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(local_process_index)
    words = pynvml.nvmlDeviceGetCpuAffinity(handle, math.ceil(os.cpu_count() / 64))  # 64-bit masks, CPU 0 first
    return [64 * w + bit for w, mask in enumerate(words) for bit in range(64) if (mask >> bit) & 1]


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs nearest its GPU (recomputed on each call).

    Rules (HF 1.15): a no-op without CUDA; on CUDA the CPU mask NVML gives for
    GPU ``local_process_index`` (`pynvml`; without it an ImportError naming
    nvidia-ml-py), on ROCm the CPUs of its NUMA node (`amdsmi`, likewise), set
    with ``os.sched_setaffinity(0, ...)``; `verbose` (default: debug mode)
    logs the CPUs assigned.
    """
    import torch

    if verbose is None:
        verbose = parse_flag_from_env("ACCELERATE_DEBUG_MODE", False)
    if not torch.cuda.is_available():
        return
    os.sched_setaffinity(0, _gpu_cpu_affinity(local_process_index))
    if verbose:
        cores = os.sched_getaffinity(0)
        logging.getLogger(__name__).info(f"Assigning {len(cores)} cpu cores to process {local_process_index}: {cores}")


@functools.lru_cache
def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """`override_numa_affinity`, done once per arguments (cached), as HF 1.15."""
    override_numa_affinity(local_process_index=local_process_index, verbose=verbose)
