"""``--fit N`` (``commands.fit``): the launch options a user reaches for when a run does not fit, each a dry run
without compute, in the order they cost, until one fits; the table; exit 1 when none does. Its refusals are rows
of ``test_dry_run.py``'s table of bad input."""

from __future__ import annotations

import argparse
import importlib.util
import re

import pytest

transformers = pytest.importorskip("transformers")

from accelerate_ref.commands import fit  # noqa: E402
from accelerate_ref.commands.accelerate_cli import run  # noqa: E402

#: A Llama of 15M parameters: with DDP each rank reserves 368 MiB, sharded in two 236 MiB.
LLAMA = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 8, "vocab_size": 2048, "max_position_embeddings": 128, "tie_word_embeddings": False}


def _launch_args(**given) -> argparse.Namespace:
    defaults = {"num_processes": 2, "use_fsdp": False, "use_deepspeed": False, "zero_stage": None, "fit": 2}
    return argparse.Namespace(**{**defaults, **given})


def test_the_ladder_adds_what_users_reach_for_in_the_order_it_costs():
    names = [option_set.name for option_set in fit.ladder(_launch_args(fit=8))]
    expected = ["as given", "FSDP2 full shard", "+ activation checkpointing", "+ 4 processes", "+ 8 processes", "+ CPU offload"]
    if importlib.util.find_spec("deepspeed") is not None:
        expected.append("DeepSpeed ZeRO-3")
    assert names == expected
    sets = {option_set.name: option_set for option_set in fit.ladder(_launch_args(fit=8))}
    assert sets["+ 8 processes"].processes == 8 and sets["+ CPU offload"].processes == 2
    assert sets["+ CPU offload"].flags == (*fit.FSDP2, *fit.CHECKPOINTING, *fit.OFFLOAD)
    # a launch that already shards with FSDP gets no second FSDP flag set, and no ZeRO-3 beside it
    sharded = [option_set.name for option_set in fit.ladder(_launch_args(use_fsdp=True, fit=2))]
    assert sharded == ["as given", "+ activation checkpointing", "+ CPU offload"]


def test_fit_tries_until_a_set_fits_and_prints_the_options_that_fit(tmp_path, capfd):
    """An estimate that runs out of memory as given (DDP: each rank holds the model and its AdamW states) fits
    once FSDP2 shards it; the trials stop there, the fitting set comes first in the table, and its options are
    printed. Every row is a dry run's verdict."""
    transformers.LlamaConfig(**LLAMA).save_pretrained(tmp_path / "llama")
    code = run(["estimate-memory", str(tmp_path / "llama"), "--training", "--num_processes", "2", "--batch_size", "1",
                "--seq_len", "32", "--device-memory", "300MiB", "--fit", "2"])
    output = capfd.readouterr().out  # the launch's own output: it prints as it goes
    assert code == 0, output
    assert re.search(r"\[1/\d\] as given: out of memory at step \d", output), output
    assert re.search(r"\[2/\d\] FSDP2 full shard: fits", output), output
    assert "[3/" not in output, output
    rows = [line for line in output.splitlines() if re.match(r"│\s*(as given|FSDP2|\+|DeepSpeed)", line)]
    assert "FSDP2 full shard" in rows[0] and "as given" in rows[1], output
    assert output.rstrip().endswith("Fits with: --num_processes 2 " + " ".join(fit.FSDP2)), output


def test_an_estimates_fit_search_past_its_deadline_is_stopped_with_its_trials_and_one_line(monkeypatch, tmp_path, capfd,
                                                                                           assert_gone):
    """``estimate-memory --training --fit`` waits for its launch at most a trial's deadline per option set of the
    ladder; past it, the launch is stopped with what it started, one line says so, and the exit status is 1."""
    from accelerate_ref.commands import estimate_training

    transformers.LlamaConfig(**LLAMA).save_pretrained(tmp_path / "llama")
    searches, start_module = [], estimate_training.start_module

    def started(*args, **kwargs):
        searches.append(start_module(*args, **kwargs))
        return searches[-1]

    monkeypatch.setattr(estimate_training, "start_module", started)
    monkeypatch.setattr(estimate_training, "fit_deadline", lambda args: 2.0)
    code = run(["estimate-memory", str(tmp_path / "llama"), "--training", "--num_processes", "2", "--batch_size", "1",
                "--seq_len", "32", "--device-memory", "300MiB", "--fit", "2"])
    errors = capfd.readouterr().err
    assert code == 1 and len(searches) == 1, errors
    assert errors.rstrip().splitlines()[-1] == "estimate-memory: the fit search had not ended 2 s after it started; stopped"
    assert_gone([searches[0].pid])


def test_an_estimates_fit_deadline_is_a_trials_for_each_option_set_of_its_ladder():
    from accelerate_ref.commands.estimate_training import fit_deadline

    given = {"model_name": ".", "num_processes": 2, "num_machines": 1, "mixed_precision": "bf16", "timeout": 300,
             "gpu": "a100-40gb", "device_memory": None, "fit": 2, "batch_size": 1, "seq_len": 8}
    trial = 300 + fit.LAUNCH_GRACE
    sets = {distributed: len(fit.ladder(_launch_args(use_fsdp=distributed == "fsdp", use_deepspeed=distributed == "zero3",
                                                     zero_stage=3 if distributed == "zero3" else None)))
            for distributed in ("ddp", "fsdp", "zero3")}
    for distributed, count in sets.items():
        assert fit_deadline(argparse.Namespace(**given, distributed=distributed)) == count * trial + fit.LAUNCH_GRACE
    assert sets["ddp"] > sets["fsdp"], sets


def test_when_no_set_fits_the_table_is_followed_by_one_line_and_exit_1(monkeypatch, tmp_path, capsys):
    """Every set tried: the table lists them all, one line says none fits, the exit status is 1."""
    tried = []

    def out_of_memory(args, base, option_set, summary):
        tried.append(option_set.name)
        return {"name": option_set.name, "flags": list(option_set.flags), "processes": option_set.processes,
                "fits": False, "peak": 2 << 30, "reserved": 2 << 30, "headroom": None, "verdict": "out of memory at step 1"}

    monkeypatch.setattr(fit, "_try", out_of_memory)
    args = _launch_args(simulate="cuda", gpu="t4-16gb", fit=4, training_script="train.py", training_script_args=[])
    assert fit.fit(args, ["launch", "--simulate", "cuda", "--gpu", "t4-16gb", "--fit", "4", "train.py"]) == 1
    output = capsys.readouterr().out
    assert tried == [option_set.name for option_set in fit.ladder(args)]
    assert all(name in output for name in tried)
    assert output.rstrip().splitlines()[-1].startswith(f"None of the {len(tried)} option sets tried fits"), output


def test_the_fit_flag_is_taken_out_of_the_command_line_it_varies():
    options, script = fit._without_fit(["launch", "--simulate", "cuda", "--fit", "8", "--gpu", "l4-24gb", "train.py", "--lr", "1"], 3)
    assert options == ["launch", "--simulate", "cuda", "--gpu", "l4-24gb"] and script == ["train.py", "--lr", "1"]
    options, _ = fit._without_fit(["launch", "--fit=2", "--simulate", "cuda", "train.py"], 1)
    assert options == ["launch", "--simulate", "cuda"]
