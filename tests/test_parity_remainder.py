"""Issue 13's name-for-name remainder: each name behaves as HF accelerate 1.15's does.

Each test calls accelerate_ref's name and HF's side by side and compares the
results (HF accelerate is installed with the `hf` extra).
"""

from __future__ import annotations

import enum
from datetime import timedelta

import pytest

hf_constants = pytest.importorskip("accelerate.utils.constants")

import accelerate.utils as hf_utils  # noqa: E402

import accelerate_ref.utils as ref_utils  # noqa: E402
from accelerate_ref.utils import constants as ref_constants  # noqa: E402


CONSTANT_NAMES = [
    "CUDA_DISTRIBUTED_TYPES",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
]

# (module of accelerate_ref, module of HF, names the module re-exports)
REEXPORTS = [
    ("accelerate_ref.accelerator", "accelerate.accelerator",
     ["MODEL_NAME", "SCALER_NAME", "WEIGHTS_NAME", "WEIGHTS_INDEX_NAME", "WEIGHTS_PATTERN_NAME",
      "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_PATTERN_NAME"]),
    ("accelerate_ref.checkpointing", "accelerate.checkpointing", ["MODEL_NAME", "SAFE_MODEL_NAME"]),
    ("accelerate_ref.utils.random", "accelerate.utils.random", ["CUDA_DISTRIBUTED_TYPES"]),
    ("accelerate_ref.utils.operations", "accelerate.utils.operations", ["TORCH_DISTRIBUTED_OPERATION_TYPES"]),
    ("accelerate_ref.utils.dataclasses", "accelerate.utils.dataclasses",
     ["XPU_PROFILING_AVAILABLE_PYTORCH_VERSION", "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION"]),
    ("accelerate_ref.utils", "accelerate.utils",
     ["TORCH_DISTRIBUTED_OPERATION_TYPES", "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
      "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION"]),
]


@pytest.mark.parametrize("name", CONSTANT_NAMES)
def test_constant_equals_hf(name: str) -> None:
    assert getattr(ref_constants, name) == getattr(hf_constants, name)


@pytest.mark.parametrize(("ref_module", "hf_module", "names"), REEXPORTS, ids=[r[0] for r in REEXPORTS])
def test_module_reexports_hf_constants(ref_module: str, hf_module: str, names: list[str]) -> None:
    import importlib

    ref, hf = importlib.import_module(ref_module), importlib.import_module(hf_module)
    assert {n: getattr(ref, n) for n in names} == {n: getattr(hf, n) for n in names}


@pytest.mark.parametrize("backend", ["nccl", "gloo", None])
@pytest.mark.parametrize("timeout", [None, timedelta(seconds=800)])
def test_init_process_group_kwargs_timeout_default_by_backend(backend, timeout) -> None:
    ref = ref_utils.InitProcessGroupKwargs(backend=backend, timeout=timeout)
    hf = hf_utils.InitProcessGroupKwargs(backend=backend, timeout=timeout)
    assert (ref.backend, ref.init_method, ref.timeout) == (hf.backend, hf.init_method, hf.timeout)


def test_enum_with_contains_tests_values() -> None:
    from accelerate.utils.dataclasses import EnumWithContains as HfMeta

    from accelerate_ref.utils.dataclasses import EnumWithContains as RefMeta

    answers = []
    for meta in (RefMeta, HfMeta):
        class Colour(enum.Enum, metaclass=meta):
            RED = "red"
            BLUE = "blue"

        answers.append(["red" in Colour, "green" in Colour, "BLUE" in Colour, "blue" in Colour])
    assert answers[0] == answers[1] == [True, False, False, True]
