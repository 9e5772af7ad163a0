"""``estimate-memory MODEL --training`` (``commands.estimate_training``): each GPU's peak while training MODEL on N
mock GPUs, dry-run without compute, and its refusals (one line, exit 2, before any rank starts).

The 7B Llama at 8 GPUs (issue 23's goal: the table in under a minute) runs under ``make extended``.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

transformers = pytest.importorskip("transformers")

from accelerate_ref.commands.accelerate_cli import run  # noqa: E402

#: A Llama small enough for make test: every sharded dimension splits evenly over 2 and 8 ranks.
TINY_LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128, "tie_word_embeddings": False}
LLAMA_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}


def _llama(folder, **config) -> str:
    transformers.LlamaConfig(**config).save_pretrained(folder)
    return str(folder)


def _parameters(config: dict) -> int:
    """The Llama's parameter count, by its shapes: embeddings, head, per layer 4 attention and 3 MLP matrices and 2
    norms, the final norm."""
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    layer = 4 * hidden * hidden + 3 * hidden * inner + 2 * hidden
    return 2 * vocab * hidden + config["num_hidden_layers"] * layer + hidden


@pytest.mark.parametrize("flags, message", [
    (["--distributed", "tp"], "--distributed 'tp' is not one of ddp, fsdp, zero2, zero3"),
    (["--mixed_precision", "fp8"], "--mixed_precision 'fp8' is not one of no, fp16, bf16"),
    (["--num_processes", "3", "--num_machines", "2"], "--num_processes 3 does not divide into 2 machines"),
])
def test_bad_training_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    folder = _llama(tmp_path / "llama", **TINY_LLAMA)
    assert run(["estimate-memory", folder, "--training", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1, error


def test_a_folder_without_a_config_or_a_hub_name_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert run(["estimate-memory", str(tmp_path / "empty"), "--training"]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert run(["estimate-memory", "meta-llama/Llama-2-7b-hf", "--training"]) == 2
    assert "reads a local model folder or config.json, offline" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed")
def test_zero_without_deepspeed_names_the_extra(tmp_path, capsys):
    folder = _llama(tmp_path / "llama", **TINY_LLAMA)
    assert run(["estimate-memory", folder, "--training", "--distributed", "zero2"]) == 2
    assert "needs deepspeed (pip install accelerate-ref[deepspeed])" in capsys.readouterr().err


def test_no_compute_needs_a_mock_device_and_a_dry_run(tmp_path, capsys):
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert run(["launch", "--simulate", "cpu", "--no-compute", str(tmp_path / "train.py")]) == 2
    assert "--no-compute needs a mock device" in capsys.readouterr().err
    assert run(["launch", "--no-compute", str(tmp_path / "train.py")]) == 2
    assert "--no-compute: only for a dry run" in capsys.readouterr().err


def _table_row(output: str) -> list[str]:
    """The cells of the table's one data row (every rank alike)."""
    lines = [line for line in output.splitlines() if line.startswith("│") and re.match(r"│\s*0", line)]
    assert len(lines) == 1, output
    return [cell.strip() for cell in lines[0].strip("│").split("│")]


def _estimate(capsys, folder: str, processes: int, distributed: str, *flags: str) -> list[str]:
    assert run(["estimate-memory", folder, "--training", "--num_processes", str(processes), "--distributed", distributed,
                "--batch_size", "2", "--seq_len", "32", *flags]) == 0
    output = capsys.readouterr().out
    assert f"{processes} GPU(s) on 1 machine(s), {distributed}" in output
    return _table_row(output)


def _mib(cell: str) -> float:
    number, unit = cell.split()
    return float(number) * {"bytes": 1 / 2**20, "KB": 1 / 1024, "MB": 1, "GB": 1024}[unit]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed (the deepspeed extra)")
def test_zero3_training_table_partitions_the_optimizer_state_and_names_the_reduce_bucket(tmp_path, capsys):
    """ZeRO-3 builds the model partitioned (``deepspeed.zero.Init``) and runs without compute: AdamW's two moments of
    each rank's partition, and DeepSpeed's reduce bucket (``reduce_bucket_size``, 5e8 fp32 elements) in its column."""
    folder = _llama(tmp_path / "llama", **TINY_LLAMA)
    row = _estimate(capsys, folder, 2, "zero3")
    shard = _parameters(TINY_LLAMA) * 4 / 2 / 2**20
    assert _mib(row[5]) == pytest.approx(2 * shard, rel=1e-2), row
    assert _mib(row[6]) == pytest.approx(500_000_000 * 4 / 2**20, rel=5e-3), row  # the cell has 3 digits


def test_fsdp_training_table_shards_the_model_states_by_the_arithmetic(tmp_path, capsys):
    folder = _llama(tmp_path / "llama", **TINY_LLAMA)
    row = _estimate(capsys, folder, 2, "fsdp")
    ranks, peak, reserved, parameters, gradients, optimizer = row[:6]
    assert ranks == "0-1" and _mib(reserved) >= _mib(peak)
    shard = _parameters(TINY_LLAMA) * 4 / 2 / 2**20
    assert _mib(parameters) == pytest.approx(shard, rel=1e-3) and _mib(optimizer) == pytest.approx(2 * shard, rel=1e-3)
    assert _mib(peak) > _mib(parameters) + _mib(optimizer)
    assert row[-1] == "-"  # no budget given


@pytest.mark.extended
def test_a_7b_llama_on_8_gpus_fits_an_80gb_card_with_fsdp_and_the_shards_are_the_arithmetic(tmp_path, capsys):
    folder = _llama(tmp_path / "llama-7b", **LLAMA_7B)
    row = _estimate(capsys, folder, 8, "fsdp", "--mixed_precision", "bf16", "--gpu", "h100-80gb")
    shard = _parameters(LLAMA_7B) * 4 / 8 / 2**20
    assert _mib(row[3]) == pytest.approx(shard, rel=1e-3), row
    assert row[-1].startswith("fits"), row
