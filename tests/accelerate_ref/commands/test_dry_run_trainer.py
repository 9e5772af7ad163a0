"""The Transformers ``Trainer`` and TRL's ``SFTTrainer`` dry-run unmodified on mock GPUs, computing and without
compute, each rank's model states the arithmetic of the setup: the Trainer's full fine-tune with gradient
checkpointing, its distribution set in ``TrainingArguments`` as users set it (DDP, FSDP2, a DeepSpeed ZeRO-2 or
ZeRO-3 config dict); the SFTTrainer's LoRA (``peft_config``) in bf16 at 1 and 2 ranks."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from .finetune_scripts import RANK, SFT_SCRIPT, SHAPES, TARGETS, TRAINER_SCRIPT, TRAINER_SETUPS, save_model

transformers = pytest.importorskip("transformers")

from accelerate_ref.commands.accelerate_cli import run  # noqa: E402

NEEDS_DEEPSPEED = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "llama"
    save_model(folder)
    return folder


def _parameters(shape: str = "llama") -> list[int]:
    """The elements of each of the model's parameters."""
    import torch

    config_class, config = SHAPES[shape]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config, tie_word_embeddings=False))
    return [param.numel() for param in model.parameters()]


#: The Trainer's two parameter groups (with and without weight decay): the tensors ZeRO flattens them into.
ZERO_GROUPS = 2


def expected(setup: str, ranks: int = 2, shape: str = "llama") -> dict[str, int]:
    """The model-state parts each of ``ranks`` ranks holds after a step: fp32 weights and gradients, and the
    Trainer's optimizer, fused AdamW (``adamw_torch_fused``), two fp32 moments and a ``step`` per tensor it steps,
    which the fused kernel keeps on the device as a float32 scalar (torch/optim/adam.py ``_init_group``). DDP: all of
    it; FSDP2: each parameter sharded over the ranks (every dimension here divides by 8); ZeRO: AdamW's state of the
    rank's flat partition, one per parameter group (its parameters and gradients follow DeepSpeed's own rules,
    checked by the setups' matrix)."""
    sizes = _parameters(shape)
    size = 4 * sum(sizes) // (1 if setup == "ddp" else ranks)
    if setup.startswith("zero"):
        return {"optimizer_state": 2 * size + 4 * ZERO_GROUPS}
    return {"trainable_parameters": size, "frozen_parameters": 0, "quantized_weights": 0, "gradients": size,
            "optimizer_state": 2 * size + 4 * len(sizes)}


def sft_expected(shape: str = "llama") -> dict[str, int]:
    """The SFTTrainer's LoRA after a step, on every rank: the adapters (fp32, ``RANK`` x (in + out) per target
    projection), their gradients, fused AdamW's two moments and a ``step`` each; the base frozen, in the saved fp32."""
    import torch

    config_class, config = SHAPES[shape]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config, tie_word_embeddings=False))
    targets = [module for name, module in model.named_modules() if name.endswith(TARGETS)]
    adapters = 4 * RANK * sum(module.in_features + module.out_features for module in targets)
    return {"trainable_parameters": adapters, "frozen_parameters": 4 * sum(p.numel() for p in model.parameters()),
            "quantized_weights": 0, "gradients": adapters, "optimizer_state": 2 * adapters + 4 * 2 * len(targets)}


def dry_run(tmp_path, capsys, folder, setup: str, no_compute: bool, ranks: int = 2, machines: int = 1) -> dict:
    script = tmp_path / "train.py"
    if setup == "sft-lora":
        script.write_text(SFT_SCRIPT.format(rank=RANK, targets=list(TARGETS)))
    else:
        script.write_text(TRAINER_SCRIPT.format(options=TRAINER_SETUPS[setup]))
    status = run(["launch", "--simulate", "cuda", "--gpu", "a100-40gb", "--num_processes", str(ranks),
                  "--num_machines", str(machines), *(["--no-compute"] if no_compute else []), "--timeout", "300",
                  "--summary-json", str(tmp_path / "summary.json"), str(script), str(folder)])
    output = capsys.readouterr()
    assert status == 0, f"Trainer {setup}:\n{output.out[-4000:]}{output.err[-2000:]}"
    trained = r"trained PeftModelForCausalLM" if setup == "sft-lora" else r"trained \w*ForCausalLM"  # FSDP2: FSDPLlama...
    assert len(re.findall(trained, output.out)) == ranks, output.out[-3000:]
    return json.loads((tmp_path / "summary.json").read_text())


#: The Trainer runs make test makes (the rest under make extended): DeepSpeed's ZeRO-3 from its config dict.
SMOKE = [("zero3", True)]
PRODUCT = [pytest.param(setup, no_compute, marks=[NEEDS_DEEPSPEED] if setup.startswith("zero") else [])
           for setup in TRAINER_SETUPS for no_compute in (False, True)]


def _check(summary: dict, setup: str, ranks: int = 2, shape: str = "llama") -> None:
    want = sft_expected(shape) if setup == "sft-lora" else expected(setup, ranks, shape)
    for rank in summary["ranks"]:
        for device, books in rank["memory"].items():
            found = {part: books["model_states"][part] for part in want}
            assert found == want, f"Trainer {setup}, rank {rank['rank']} on {device}: {books['model_states']}, expected {want}"


@pytest.mark.parametrize("setup, no_compute", [param for param in PRODUCT if tuple(param.values) in SMOKE])
def test_trainer_dry_runs_with_model_states_as_the_arithmetic(tmp_path, capsys, llama, setup, no_compute):
    _check(dry_run(tmp_path, capsys, llama, setup, no_compute), setup)


@pytest.mark.extended
@pytest.mark.parametrize("setup, no_compute", [param for param in PRODUCT if tuple(param.values) not in SMOKE])
def test_every_trainer_setup(tmp_path, capsys, llama, setup, no_compute):
    _check(dry_run(tmp_path, capsys, llama, setup, no_compute), setup)


@pytest.mark.parametrize("ranks, no_compute", [(2, False), pytest.param(1, True, marks=pytest.mark.extended),
                                               pytest.param(2, True, marks=pytest.mark.extended),
                                               pytest.param(1, False, marks=pytest.mark.extended)])
def test_sft_trainer_with_lora_dry_runs_with_model_states_as_the_arithmetic(tmp_path, capsys, llama, ranks, no_compute):
    """TRL's SFTTrainer in bf16, computing: its chunked log-probabilities accumulate a bf16 product in fp32
    (``torch.addmm(..., out_dtype=torch.float32)``, a CUDA-only kernel the mock runs by its rule)."""
    want = sft_expected()
    for rank in dry_run(tmp_path, capsys, llama, "sft-lora", no_compute, ranks)["ranks"]:
        for device, books in rank["memory"].items():
            assert books["model_states"] == want, f"SFTTrainer, rank {rank['rank']} on {device}: {books['model_states']}, expected {want}"


@pytest.mark.extended
@pytest.mark.parametrize("setup", ["fsdp2", pytest.param("zero3", marks=NEEDS_DEEPSPEED), "sft-lora"])
def test_trainers_at_8_ranks_as_2_machines_without_compute(tmp_path, capsys, llama, setup):
    _check(dry_run(tmp_path, capsys, llama, setup, True, ranks=8, machines=2), setup, ranks=8)


@pytest.mark.extended
@pytest.mark.parametrize("setup", ["fsdp2", "sft-lora"])
def test_trainers_on_the_qwen_shape(tmp_path_factory, tmp_path, capsys, setup):
    """The same recipes on a Qwen2-shaped model (its attention projections have biases)."""
    folder = tmp_path_factory.mktemp("models") / "qwen"
    save_model(folder, "qwen")
    _check(dry_run(tmp_path, capsys, folder, setup, False), setup, shape="qwen")
