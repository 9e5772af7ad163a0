"""simulators.dryrun's helpers that need no ranks (the dry runs themselves: tests/accelerate_ref/commands)."""
import textwrap

from simulators.dryrun import DEEPSPEED, DISTRIBUTED, FORK_SAFE, preload

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
    assert preload(str(script)) == [*TORCH, "accelerate", "lomo_optim", "safetensors.torch", "transformers",
                                    "transformers.modeling_utils", "accelerate:Accelerator", "transformers:LlamaConfig",
                                    "transformers:LlamaForCausalLM"]


def test_a_distributed_or_deepspeed_run_preloads_what_its_ranks_import_when_they_wrap_the_model(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom accelerate import Accelerator\n")
    single = preload(str(script))

    def added(*args) -> list[str]:
        return [module for module in preload(str(script), *args) if module not in single]

    assert added(2) == list(DISTRIBUTED["accelerate"])
    assert added(2, True) == [*DISTRIBUTED["accelerate"], *DEEPSPEED]  # a DeepSpeed launch
    assert added(1, False) == []
    script.write_text("from accelerate import Accelerator\nfrom accelerate.utils import DeepSpeedPlugin\n")
    assert added(1) == ["accelerate.utils:DeepSpeedPlugin"]  # importing the name is not asking for DeepSpeed
    for asking in ("Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))", "TrainingArguments('out', deepspeed=config)"):
        script.write_text(f"from accelerate import Accelerator\n{asking}\n")
        assert added(1) == list(DEEPSPEED), asking
    script.write_text("import torch\n")  # no library that wraps a model
    assert preload(str(script), 2) == TORCH


def test_a_module_that_is_not_installed_is_not_preloaded(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("from accelerate import Accelerator\n")
    monkeypatch.setattr("simulators.dryrun._installed", lambda module: module != "lomo_optim")
    assert "lomo_optim" not in preload(str(script))


def test_a_script_that_does_not_parse_preloads_torch_only(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import transformers\ndef (:\n")
    assert preload(str(script)) == TORCH
    assert preload(str(tmp_path / "missing.py")) == TORCH
