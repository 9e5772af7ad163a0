"""simulators.dryrun's helpers that need no ranks (the dry runs themselves: tests/accelerate_ref/commands)."""
import textwrap

from simulators.dryrun import FORK_SAFE, preload

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
