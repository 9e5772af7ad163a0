"""Fine-tune recipes dry-run unmodified on mock GPUs: peft LoRA (with and without gradient checkpointing), QLoRA
(bitsandbytes 4-bit NF4 with double quantization, FP4 without) and LoRA on an 8-bit base, each with each rank's model
states equal to the arithmetic for trainable, frozen and quantized parameters.

The arithmetic (bytes at the end of an optimizer step, the gradients not yet zeroed):

- trainable: peft's LoRA matrices A (r x in) and B (out x r) of each target, in fp32 (peft casts adapters to fp32);
  their gradients the same; AdamW's two moments twice that (its step counters stay on the host);
- frozen: every other parameter of the base at its dtype: fp32 in a full-precision base, and in a quantized base,
  where ``prepare_model_for_kbit_training`` casts the unquantized ones (embeddings, norms, head, an 8-bit
  layer's bias) to fp32, but a 4-bit layer's bias (Qwen's q, k and v projections have one), which
  ``Linear4bit.forward`` casts to its input's dtype, bf16 here (bitsandbytes/nn/modules.py);
- quantized (bitsandbytes' CUDA layout, bitsandbytes/functional.py ``quantize_4bit`` and
  ``int8_vectorwise_quant``): a 4-bit weight of n values is n/2 packed bytes, its absmax one value per 64-value block
  (fp32, or with double quantization one byte per block plus an fp32 absmax per 256 blocks, the 256-entry fp32 code of
  that second quantization and its fp32 offset) and the 16-entry fp32 code of NF4/FP4; an 8-bit weight is n int8
  values and an fp32 scale per output row.

``make test`` runs one world of each recipe family; ``make extended`` runs the whole matrix.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from accelerate_ref.commands.accelerate_cli import run

from .finetune_scripts import RANK, RECIPES, SCRIPT, SHAPES, TARGETS

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None or importlib.util.find_spec("bitsandbytes") is None,
    reason="peft and bitsandbytes are not installed (extra finetune)")

@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """Each decoder shape saved locally from its config (seed 0)."""
    import torch
    import transformers

    folders = {}
    for shape, (config_class, config) in SHAPES.items():
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(shape)
        config = getattr(transformers, config_class)(**config, tie_word_embeddings=False)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        folders[shape] = folder
    return folders


def _quantized_bytes(elements: int, out_features: int, quantization: str) -> int:
    """Bytes of one bitsandbytes weight of ``elements`` values as its CUDA kernels lay it out (module docstring)."""
    if "load_in_8bit" in quantization:
        return elements + 4 * out_features
    blocks = math.ceil(elements / 64)
    absmax = blocks + 4 * math.ceil(blocks / 256) + 4 * 256 + 4 if "double_quant=True" in quantization else 4 * blocks
    return math.ceil(elements / 2) + absmax + 4 * 16


def arithmetic(shape: str, recipe: str) -> dict[str, int]:
    """Each model-state part of one rank after a step of ``recipe`` on ``shape`` (see the module docstring)."""
    import torch
    import transformers

    config_class, config = SHAPES[shape]
    with torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config, tie_word_embeddings=False))
    quantization, _ = RECIPES[recipe]
    trainable = frozen = quantized = 0
    for name, module in base.named_modules():
        if isinstance(module, torch.nn.Linear) and name.endswith(TARGETS):
            trainable += 4 * RANK * (module.in_features + module.out_features)
    for name, param in base.named_parameters():
        owner = base.get_submodule(name.rsplit(".", 1)[0])
        quantized_layer = quantization and isinstance(owner, torch.nn.Linear) and name.startswith("model.layers.")
        if quantized_layer and name.endswith(".weight"):
            quantized += _quantized_bytes(param.numel(), owner.out_features, quantization)
        elif quantized_layer and "load_in_4bit" in quantization:  # Linear4bit.forward casts its bias to the input's bf16
            frozen += 2 * param.numel()
        else:
            frozen += 4 * param.numel()
    return {"trainable_parameters": trainable, "frozen_parameters": frozen, "quantized_weights": quantized,
            "gradients": trainable, "optimizer_state": 2 * trainable}


def dry_run(tmp_path, capsys, folder, recipe: str, ranks: int, machines: int = 1, no_compute: bool = False) -> dict:
    """``accelerate-ref launch --simulate cuda`` of ``recipe``'s script; its summary (asserting it ended well)."""
    quantization, checkpointing = RECIPES[recipe]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(quantization=quantization, checkpointing=checkpointing, rank=RANK, targets=list(TARGETS)))
    status = run(["launch", "--simulate", "cuda", "--gpu", "a100-40gb", "--num_processes", str(ranks),
                  "--num_machines", str(machines), *(["--no-compute"] if no_compute else []), "--timeout", "300",
                  "--summary-json", str(tmp_path / "summary.json"), str(script), str(folder)])
    output = capsys.readouterr()
    assert status == 0, f"{recipe} at {ranks} rank(s):\n{output.out[-4000:]}{output.err[-2000:]}"
    assert output.out.count("trained PeftModel") == ranks, output.out[-3000:]
    return json.loads((tmp_path / "summary.json").read_text())


def check_model_states(summary: dict, shape: str, recipe: str) -> None:
    expected = arithmetic(shape, recipe)
    for rank in summary["ranks"]:
        for device, books in rank["memory"].items():
            assert books["model_states"] == expected, (
                f"{recipe} on a {shape}-shaped model, rank {rank['rank']} on {device}: model states "
                f"{books['model_states']}, the arithmetic says {expected}")


SMOKE = [("llama", "qlora-nf4", 2, False), ("qwen", "lora-checkpointing", 2, True), ("llama", "lora-8bit", 1, False)]
PRODUCT = [(shape, recipe, ranks, no_compute) for shape in SHAPES for recipe in RECIPES for ranks in (1, 2) for no_compute in (False, True)]


@pytest.mark.parametrize("shape, recipe, ranks, no_compute", SMOKE)
def test_recipe_dry_runs_with_model_states_as_the_arithmetic(tmp_path, capsys, saved_models, shape, recipe, ranks, no_compute):
    check_model_states(dry_run(tmp_path, capsys, saved_models[shape], recipe, ranks, no_compute=no_compute), shape, recipe)


@pytest.mark.extended
@pytest.mark.parametrize("shape, recipe, ranks, no_compute", [case for case in PRODUCT if case not in SMOKE])
def test_every_recipe_shape_and_world(tmp_path, capsys, saved_models, shape, recipe, ranks, no_compute):
    check_model_states(dry_run(tmp_path, capsys, saved_models[shape], recipe, ranks, no_compute=no_compute), shape, recipe)


@pytest.mark.extended
@pytest.mark.parametrize("recipe", ["lora", "qlora-nf4"])
def test_recipe_at_8_ranks_as_2_machines_without_compute(tmp_path, capsys, saved_models, recipe):
    check_model_states(dry_run(tmp_path, capsys, saved_models["llama"], recipe, 8, machines=2, no_compute=True), "llama", recipe)

