"""simulators.dryrun's helpers that need no ranks (the dry runs themselves: tests/accelerate_ref/commands)."""
import textwrap

from simulators.dryrun import FORK_SAFE, WATCH_ENV, WATCH_INTERVAL_S, preload, watch_interval

TORCH = list(FORK_SAFE["torch"])


def test_a_dry_run_preloads_torch_and_the_fork_safe_libraries_the_script_imports(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import transformers.models.llama
        from accelerate import Accelerator
        from transformers import LlamaConfig, LlamaForCausalLM
        from . import sibling
        from helpers import data
        def later():
            import safetensors.torch
    """))
    assert preload(str(script)) == [*TORCH, "accelerate", "safetensors.torch", "transformers", "transformers.modeling_utils",
                                    "accelerate:Accelerator", "transformers:LlamaConfig", "transformers:LlamaForCausalLM"]


def test_a_script_that_does_not_parse_preloads_torch_only(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import transformers\ndef (:\n")
    assert preload(str(script)) == TORCH
    assert preload(str(tmp_path / "missing.py")) == TORCH


def test_the_watch_reads_a_larger_world_less_often_and_its_variable_wins(monkeypatch):
    monkeypatch.delenv(WATCH_ENV, raising=False)
    assert [watch_interval(ranks) for ranks in (1, 8, 16, 64)] == [WATCH_INTERVAL_S, WATCH_INTERVAL_S,
                                                                   2 * WATCH_INTERVAL_S, 8 * WATCH_INTERVAL_S]
    monkeypatch.setenv(WATCH_ENV, "0.5")
    assert watch_interval(64) == 0.5, "SIMULATORS_WATCH_INTERVAL sets the interval whatever the world"
    monkeypatch.setenv(WATCH_ENV, "0")
    assert watch_interval(8) is None, "SIMULATORS_WATCH_INTERVAL=0 turns the watch off"
