"""Shared fixtures of the project's own tests."""
import os
import warnings

import pytest

from simulators.fork_root import FORK_ROOT_ENV, ForkRoot, ForkRootError
from tests.processes import still_running


@pytest.fixture(scope="session", autouse=True)
def fork_root():
    """One root fork server per test process: the fork servers its tests start, in-process or under a command they
    run, and the commands run through :func:`simulators.fork_root.run_module`, fork from it instead of importing torch
    again (see :mod:`simulators.fork_root`). ``SIMULATORS_FORK_ROOT=off`` runs the tests without one."""
    if os.environ.get(FORK_ROOT_ENV) == "off":
        del os.environ[FORK_ROOT_ENV]
        yield None
        return
    # torch sets TORCHINDUCTOR_CACHE_DIR in a process's environment the first time inductor asks for its cache folder
    # (torch/_inductor/runtime/cache_dir_utils.py), and reads it at import: set from the start, it is the same for
    # every process the tests start, which then share bases (``simulators._fork_root.torch_environment``).
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache_dir()
    try:
        root = ForkRoot()
    except ForkRootError as error:  # the tests still run, each fork server spawned; test_fork_root fails on it
        warnings.warn(f"no root fork server: {error}", RuntimeWarning)
        yield None
        return
    with root:
        yield root


@pytest.fixture
def assert_gone():
    """``assert_gone(pids)`` fails unless every pid is gone within 5 s (SIGKILL takes effect asynchronously)."""

    def check(pids, timeout: float = 5.0) -> None:
        alive = still_running(pids, timeout)
        assert not alive, f"processes still running: {alive}"

    return check


@pytest.fixture
def fresh_accelerate_state():
    """The reference's process-wide state forgotten before and after the test (as HF's own tests reset theirs)."""
    from accelerate_ref.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture
def fresh_states():
    """Both implementations' accelerator and gradient states forgotten before and after the test."""
    import importlib

    def forget_all() -> None:
        for impl in ("accelerate", "accelerate_ref"):
            state = importlib.import_module(f"{impl}.state")
            state.AcceleratorState._reset_state(True)
            state.GradientState._reset_state()

    forget_all()
    yield
    forget_all()


def pytest_collection_modifyitems(items):
    """Tests marked ``longest`` (minutes each) run first: under ``pytest -n 2`` each goes to its own
    worker at once, so that neither is left to run alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


@pytest.fixture
def no_fp8_environment(monkeypatch):
    """Every test starts without ACCELERATE_FP8_* variables (the recipes read them)."""
    for key in [k for k in os.environ if k.startswith("ACCELERATE_FP8_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def fresh_fp8_capability():
    """Both libraries cache check_cuda_fp8_capability for the process: each test asks afresh."""
    import accelerate.utils.environment as hf_environment

    import accelerate_ref.utils as ref_utils

    for check in (ref_utils.check_cuda_fp8_capability, hf_environment.check_cuda_fp8_capability):
        check.cache_clear()
    yield
    for check in (ref_utils.check_cuda_fp8_capability, hf_environment.check_cuda_fp8_capability):
        check.cache_clear()


@pytest.fixture
def fake_nvml_gpu(monkeypatch):
    """A CUDA machine as both libraries' NUMA-affinity code sees it: ``torch.cuda.is_available()`` true, no ROCm, a
    stand-in ``pynvml`` whose GPUs are near CPUs 1, 3 and 65 of 128, and ``os.sched_setaffinity`` recorded; the
    cached ``set_numa_affinity`` of both forgotten before and after. Yields the list of pinned CPU lists."""
    import importlib.machinery
    import sys
    import types

    import accelerate.utils as hf_utils
    import accelerate.utils.environment as hf_environment
    import torch

    import accelerate_ref.utils.environment as ref_environment
    import accelerate_ref.utils.imports as ref_imports

    fake_nvml = types.ModuleType("pynvml")
    fake_nvml.__spec__ = importlib.machinery.ModuleSpec("pynvml", None)
    fake_nvml.nvmlInit = lambda: None
    fake_nvml.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    fake_nvml.nvmlDeviceGetCpuAffinity = lambda handle, words: [0b1010, 0b10][:words] + [0] * max(0, words - 2)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    for module in (hf_utils, ref_imports):
        monkeypatch.setattr(module, "is_rocm_available", lambda: False)
        monkeypatch.setattr(module, "is_pynvml_available", lambda: True)
    pinned = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append(sorted(cpus)))
    for environment in (ref_environment, hf_environment):
        environment.set_numa_affinity.cache_clear()
    yield pinned
    for environment in (ref_environment, hf_environment):
        environment.set_numa_affinity.cache_clear()
