"""Probes of ``accelerate.utils.dataclasses``' engine configurations that need no engine to validate:
``BnbQuantizationConfig`` and the FP8 recipe kwargs (TransformerEngine, MS-AMP and torchao are not installed
here, so their recipes are refused as HF refuses them)."""

from __future__ import annotations

import os

import torch

from ..probe import Api, probe

AREA = "utils.dataclasses"
BNB = "utils.dataclasses.BnbQuantizationConfig"


def _build_bnb(api: Api, label: str, **values) -> None:
    config = api.call(label, BNB, **values)
    if config is not None:
        api.record(f"{label}: target_dtype", config.target_dtype)


@probe(AREA)
def bnb_quantization_config(api: Api) -> None:
    _build_bnb(api, "8-bit", load_in_8bit=True)
    _build_bnb(api, "4-bit", load_in_4bit=True)
    _build_bnb(api, "4-bit nf4 bf16 double quant", load_in_4bit=True, bnb_4bit_quant_type="nf4",
               bnb_4bit_compute_dtype="bf16", bnb_4bit_use_double_quant=True, skip_modules=["head"],
               keep_in_fp32_modules=["norm"])
    _build_bnb(api, "8-bit with a torch_dtype name", load_in_8bit=True, torch_dtype="bf16")
    _build_bnb(api, "8-bit with a torch dtype", load_in_8bit=True, torch_dtype=torch.float32)
    _build_bnb(api, "4-bit with a compute dtype", load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
    _build_bnb(api, "4-bit compute fp32 by name", load_in_4bit=True, bnb_4bit_compute_dtype="fp32")
    _build_bnb(api, "4-bit with a threshold", load_in_4bit=True, llm_int8_threshold=5)
    _build_bnb(api, "8-bit with an int threshold", load_in_8bit=True, llm_int8_threshold=4)
    refusals = {
        "neither": {},
        "both": {"load_in_8bit": True, "load_in_4bit": True},
        "8-bit not a bool": {"load_in_8bit": 1},
        "4-bit not a bool": {"load_in_4bit": "yes"},
        "both not bools": {"load_in_8bit": 1, "load_in_4bit": 1},
        "threshold a string": {"load_in_8bit": True, "llm_int8_threshold": "6"},
        "quant type not a string": {"load_in_4bit": True, "bnb_4bit_quant_type": 4},
        "quant type unknown": {"load_in_4bit": True, "bnb_4bit_quant_type": "int4"},
        "double quant not a bool": {"load_in_4bit": True, "bnb_4bit_use_double_quant": "no"},
        "double quant not a bool, both on": {"load_in_4bit": True, "load_in_8bit": True,
                                             "bnb_4bit_use_double_quant": 0},
        "compute dtype unknown name": {"load_in_4bit": True, "bnb_4bit_compute_dtype": "fp8"},
        "compute dtype not a dtype": {"load_in_4bit": True, "bnb_4bit_compute_dtype": 16},
        "skip_modules a string": {"load_in_8bit": True, "skip_modules": "head"},
        "keep_in_fp32_modules a tuple": {"load_in_8bit": True, "keep_in_fp32_modules": ("norm",)},
        "torch_dtype unknown name": {"load_in_8bit": True, "torch_dtype": "fp64"},
        "torch_dtype not a dtype": {"load_in_8bit": True, "torch_dtype": 32},
        "4-bit compute dtype not a dtype, threshold": {"load_in_4bit": True, "llm_int8_threshold": 1.0,
                                                       "torch_dtype": "half"},
    }
    for label, values in refusals.items():
        _build_bnb(api, label, **values)


@probe(AREA)
def fp8_recipe_kwargs(api: Api) -> None:
    api.call("TERecipeKwargs", "utils.dataclasses.TERecipeKwargs")
    api.call("TERecipeKwargs with a format", "utils.dataclasses.TERecipeKwargs", fp8_format="E4M3")
    api.call("AORecipeKwargs", "utils.dataclasses.AORecipeKwargs")
    api.call("MSAMPRecipeKwargs", "utils.dataclasses.MSAMPRecipeKwargs")
    api.call("MSAMPRecipeKwargs O1", "utils.dataclasses.MSAMPRecipeKwargs", opt_level="O1")
    api.call("MSAMPRecipeKwargs O3", "utils.dataclasses.MSAMPRecipeKwargs", opt_level="O3")
    api.call("MSAMPRecipeKwargs o1", "utils.dataclasses.MSAMPRecipeKwargs", opt_level="o1")
    recipe = api.call("MSAMPRecipeKwargs to_kwargs", "utils.dataclasses.MSAMPRecipeKwargs", opt_level="O1")
    if recipe is not None:
        api.observe("MSAMPRecipeKwargs.to_kwargs", recipe.to_kwargs)
        api.observe("MSAMPRecipeKwargs.to_dict", recipe.to_dict)
    api.call("FP8RecipeKwargs", "utils.dataclasses.FP8RecipeKwargs")
    api.call("FP8RecipeKwargs msamp", "utils.dataclasses.FP8RecipeKwargs", backend="msamp")
    api.call("FP8RecipeKwargs te", "utils.dataclasses.FP8RecipeKwargs", backend="te", fp8_format="E5M2")
    api.call("FP8RecipeKwargs unknown backend", "utils.dataclasses.FP8RecipeKwargs", backend="ao")
    os.environ["ACCELERATE_FP8_OPT_LEVEL"] = "O1"
    api.call("MS-AMP level from the environment", "utils.dataclasses.MSAMPRecipeKwargs")
    os.environ["ACCELERATE_FP8_OPT_LEVEL"] = "O9"
    api.call("an unknown level from the environment", "utils.dataclasses.MSAMPRecipeKwargs")
    os.environ["ACCELERATE_FP8_BACKEND"] = "nope"
    api.call("an unknown backend from the environment", "utils.dataclasses.FP8RecipeKwargs")
