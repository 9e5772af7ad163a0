"""simulators.dryrun's helpers that need no ranks (the dry runs themselves: tests/accelerate_ref/commands)."""
import textwrap

from simulators.dryrun import DEEPSPEED, DEEPSPEED_ENGINE, DISTRIBUTED, FORK_SAFE, preload

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
    assert added(2, True) == [*DISTRIBUTED["accelerate"], *DEEPSPEED_ENGINE]  # a DeepSpeed launch
    assert added(1, False) == []
    script.write_text("from accelerate import Accelerator\nfrom accelerate.utils import DeepSpeedPlugin\n")
    assert added(1) == ["accelerate.utils:DeepSpeedPlugin"]  # importing the name is not asking for DeepSpeed
    for asking in ("Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))", "TrainingArguments('out', deepspeed=config)"):
        script.write_text(f"from accelerate import Accelerator\n{asking}\n")
        assert added(1) == list(DEEPSPEED_ENGINE), asking
    script.write_text("import torch\n")  # no library that wraps a model
    assert preload(str(script), 2) == TORCH


def test_a_run_where_hf_unwraps_the_model_preloads_deepspeed_at_more_than_one_rank(tmp_path):
    """HF's ``extract_model_from_parallel`` imports DeepSpeed wherever it is installed: its FSDP and
    tensor-parallel prepare and its unwrapping methods reach it, so each rank would import DeepSpeed's package, but
    not the optimizer module only its engine imports."""
    script = tmp_path / "train.py"

    def deepspeed_preloaded(code: str, ranks: int = 2, sharded: bool = False) -> bool:
        script.write_text(f"from accelerate import Accelerator\naccelerator = Accelerator()\n{code}\n")
        preloaded = set(preload(str(script), ranks, sharded=sharded))
        assert not set(DEEPSPEED_ENGINE) - set(DEEPSPEED) & preloaded, f"{code}: unwrapping imports DeepSpeed, not its engine"
        return set(DEEPSPEED) <= preloaded

    for code in ("accelerator.unwrap_model(model).save_pretrained('out')", "accelerator.save_model(model, 'out')",
                 "accelerator.get_state_dict(model)", "Accelerator(fsdp_plugin=plugin)",
                 "FullyShardedDataParallelPlugin(fsdp_version=2)", "ParallelismConfig(tp_size=2)",
                 "TrainingArguments('out', fsdp='full_shard')"):
        assert deepspeed_preloaded(code), code
        assert not deepspeed_preloaded(code, ranks=1), f"{code}: the one rank would import it, not several"
    assert deepspeed_preloaded("model = accelerator.prepare(model)", sharded=True), "a launch with --use_fsdp"
    assert not deepspeed_preloaded("model = accelerator.prepare(model)"), "DDP's prepare does not unwrap"
    script.write_text("from accelerate_ref import Accelerator\naccelerator.unwrap_model(model)\n")
    assert not set(DEEPSPEED) & set(preload(str(script), 2)), "accelerate_ref's unwrap_model imports no DeepSpeed"


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
