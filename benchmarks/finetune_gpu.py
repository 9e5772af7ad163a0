"""The fine-tune recipes' allocated and reserved peaks on a real GPU, and as a dry run predicts them.

Each recipe of ``tests/accelerate_ref/commands/finetune_scripts.py`` (LoRA, LoRA with gradient checkpointing, QLoRA
NF4 with double quantization, QLoRA FP4, LoRA on an 8-bit base) trains a Llama-shaped model saved locally from its
config, at world 1, and prints ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()``.

On the GPU (torch, HF accelerate, Transformers, peft and bitsandbytes; nothing of this project but this tree)::

    python benchmarks/finetune_gpu.py measure OUT.json

Here, the same recipes dry-run on a mock GPU, and predicted / real where a measurement is given::

    python benchmarks/finetune_gpu.py predict [OUT.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "accelerate_ref" / "commands"))

from finetune_scripts import RANK, RECIPES, SCRIPT, SHAPES, TARGETS  # noqa: E402  (plain strings: no project import)

PEAKS = re.compile(r"peaks 0 (\d+) (\d+)")


def _save(folder: Path) -> None:
    import torch
    import transformers

    config_class, config = SHAPES["llama"]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config, tie_word_embeddings=False))
    model.save_pretrained(folder)


def peaks(launcher: list[str]) -> dict[str, dict[str, int]]:
    """Each recipe's allocated and reserved peaks under ``launcher`` (a command that runs a script at world 1)."""
    found = {}
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "llama"
        _save(folder)
        for recipe, (quantization, checkpointing) in RECIPES.items():
            script = Path(work) / f"{recipe}.py"
            script.write_text(SCRIPT.format(quantization=quantization, checkpointing=checkpointing, rank=RANK, targets=list(TARGETS)))
            done = subprocess.run([*launcher, str(script), str(folder)], capture_output=True, text=True, timeout=600)
            match = PEAKS.search(done.stdout)
            if done.returncode or not match:
                raise SystemExit(f"{recipe} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            found[recipe] = {"allocated": int(match.group(1)), "reserved": int(match.group(2))}
            print(recipe, found[recipe], flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["measure", "predict"])
    parser.add_argument("path", nargs="?", help="measure: where to write; predict: a measurement to compare with")
    args = parser.parse_args()
    if args.mode == "measure":
        found = peaks([sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1"])
        Path(args.path).write_text(json.dumps(found, indent=1))
        return
    predicted = peaks([sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                       "--num_processes", "1"])
    if args.path:
        real = json.loads(Path(args.path).read_text())
        for recipe, figures in predicted.items():
            ratios = {kind: round(figures[kind] / real[recipe][kind], 4) for kind in figures if recipe in real}
            print(recipe, "predicted / real:", ratios)


if __name__ == "__main__":
    main()
