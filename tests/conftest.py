"""Shared fixtures of the project's own tests."""
import dataclasses
import os
import warnings

import pytest

from simulators.fork_root import FORK_ROOT_ENV, ForkRoot, ForkRootError
from tests.processes import still_running


@dataclasses.dataclass(frozen=True)
class SharedRoot:
    """The root a pytest-xdist controller started for its workers (:func:`pytest_configure`): its socket, named in
    every worker's environment, and its pid."""

    socket_path: str
    pid: int


#: Where the pytest-xdist controller keeps the root it started for its workers.
_CONTROLLERS_ROOT = pytest.StashKey[ForkRoot | None]()


def _start_root() -> ForkRoot | None:
    """A root fork server for this process and the processes it starts, named in ``os.environ``; None, with a
    warning, where it does not start (the tests still run, each fork server spawned; test_fork_root fails on it)."""
    # torch sets TORCHINDUCTOR_CACHE_DIR in a process's environment the first time inductor asks for its cache folder
    # (torch/_inductor/runtime/cache_dir_utils.py), and reads it at import: set from the start, it is the same for
    # every process the tests start, which then share bases (``simulators._fork_root.torch_environment``).
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    cache_dir()
    try:
        return ForkRoot()
    except ForkRootError as error:
        warnings.warn(f"no root fork server: {error}", RuntimeWarning)
        return None


def _is_xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, the controller starts the one root its workers share (before it starts them, so that
    they inherit its name in their environment): the bases a worker's children need are often the other's too."""
    if _is_xdist_controller(config) and os.environ.get(FORK_ROOT_ENV) != "off":
        config.stash[_CONTROLLERS_ROOT] = _start_root()


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_CONTROLLERS_ROOT, None)
    if root is not None:
        root.close()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist's hook, in the controller, for each worker it starts: the shared root's pid goes with it."""
    root = node.config.stash.get(_CONTROLLERS_ROOT, None)
    if root is not None:
        node.workerinput["fork_root"] = [root.socket_path, root.pid]


@pytest.fixture(scope="session", autouse=True)
def fork_root(request):
    """The root fork server of this test process: the fork servers its tests start, in-process or under a command
    they run, and the commands run through :func:`simulators.fork_root.run_module`, fork from it instead of
    importing torch again (see :mod:`simulators.fork_root`). Under pytest-xdist it is the controller's, shared by
    the workers (:class:`SharedRoot`); otherwise the process starts its own. ``SIMULATORS_FORK_ROOT=off`` runs the
    tests without one."""
    if os.environ.get(FORK_ROOT_ENV) == "off":
        del os.environ[FORK_ROOT_ENV]
        yield None
        return
    shared = getattr(request.config, "workerinput", {}).get("fork_root")
    if shared is not None and os.environ.get(FORK_ROOT_ENV) == shared[0]:
        yield SharedRoot(*shared)
        return
    root = _start_root()
    if root is None:
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
