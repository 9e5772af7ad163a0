"""Catalog: constants.names, save_state.file_names."""

import accelerate_ref.utils as utils
from accelerate_ref.utils import constants


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
