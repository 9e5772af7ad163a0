"""Catalog: constants.names, save_state.file_names."""


import pytest

import accelerate_ref.utils as utils
from accelerate_ref.utils import constants
from accelerate_ref.utils import constants as ref_constants  # noqa: E402


def test_documented_names():
    """constants.names: every documented value, reachable as `utils.<NAME>`."""
    documented = {
        "MODEL_NAME": "pytorch_model",
        "OPTIMIZER_NAME": "optimizer",
        "RNG_STATE_NAME": "random_states",
        "SCALER_NAME": "scaler.pt",
        "SCHEDULER_NAME": "scheduler",
        "WEIGHTS_NAME": "pytorch_model.bin",
        "SAFE_WEIGHTS_NAME": "model.safetensors",
        "WEIGHTS_INDEX_NAME": "pytorch_model.bin.index.json",
        "SAFE_WEIGHTS_INDEX_NAME": "model.safetensors.index.json",
    }
    assert {name: getattr(utils, name) for name in documented} == documented


def test_undocumented_names_match_hf():
    """Names the documents do not list carry HF accelerate's values."""
    assert constants.SAFE_MODEL_NAME == "model"
    assert constants.SAMPLER_NAME == "sampler"
    assert constants.PROFILE_PATTERN_NAME.format(suffix="0") == "profile_0.json"
    assert constants.WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002") == "pytorch_model-00001-of-00002.bin"
    assert constants.SAFE_WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002") == "model-00001-of-00002.safetensors"


hf_constants = pytest.importorskip("accelerate.utils.constants")


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
