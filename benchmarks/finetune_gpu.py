"""The fine-tune recipes' allocated and reserved peaks on a real GPU, and as a dry run predicts them.

Each recipe of ``tests/accelerate_ref/commands/finetune_scripts.py`` (LoRA, LoRA with gradient checkpointing, QLoRA
NF4 with double quantization, QLoRA FP4, LoRA on an 8-bit base, the Transformers ``Trainer``, TRL's ``SFTTrainer``
with LoRA) trains a Llama-shaped model saved locally from its config, at world 1, and prints
``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()``. On the GPU, ``measure`` also records what the
runtime holds beside torch's allocator (``simulators.devices.families.gpus``): the CUDA context (free memory before and after
``torch.cuda.init()``, by ``nvidia-smi``'s reckoning through ``mem_get_info``) and NCCL's buffers for a group of one
(free memory before and after the group's first all-reduce, less what torch's allocator took).

On the GPU (torch, HF accelerate, Transformers, peft, bitsandbytes, trl; nothing of this project but this tree)::

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

from finetune_scripts import (  # noqa: E402  (plain strings: no project import)
    RANK, RECIPES, SCRIPT, SFT_SCRIPT, TARGETS, TRAINER_SCRIPT, TRAINER_SETUPS, save_model,
)

PEAKS = re.compile(r"peaks 0 (\d+) (\d+)")


def _scripts() -> dict[str, str]:
    """Each recipe's script: the peft recipes, the Trainer (DDP at world 1) and the SFTTrainer with LoRA."""
    scripts = {recipe: SCRIPT.format(quantization=quantization, checkpointing=checkpointing, rank=RANK, targets=list(TARGETS))
               for recipe, (quantization, checkpointing) in RECIPES.items()}
    scripts["trainer"] = TRAINER_SCRIPT.format(options=TRAINER_SETUPS["ddp"])
    scripts["sft-lora"] = SFT_SCRIPT.format(rank=RANK, targets=list(TARGETS))
    return scripts


#: Measures, on a GPU, what its runtime holds beside torch's allocator (see the module docstring); prints one JSON line.
RUNTIME_PROBE = """\
import json, os, torch, torch.distributed as dist
total = torch.cuda.mem_get_info()[1]
free_before = torch.cuda.mem_get_info()[0]  # the first call makes the context
torch.cuda.init()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
before = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()
dist.all_reduce(torch.ones(1, device="cuda"))
torch.cuda.synchronize()
after = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved()
print(json.dumps({"total_memory": torch.cuda.get_device_properties(0).total_memory, "mem_get_info_total": total,
                  "context": total - free_before, "nccl_group_of_one": before - after}))
dist.destroy_process_group()
"""


def peaks(launcher: list[str]) -> dict[str, dict[str, int]]:
    """Each recipe's allocated and reserved peaks under ``launcher`` (a command that runs a script at world 1)."""
    found = {}
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "llama"
        save_model(folder)
        for recipe, text in _scripts().items():
            script = Path(work) / f"{recipe}.py"
            script.write_text(text)
            done = subprocess.run([*launcher, str(script), str(folder)], capture_output=True, text=True, timeout=600, cwd=work)
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
        runtime = subprocess.run([sys.executable, "-c", RUNTIME_PROBE], capture_output=True, text=True, timeout=300)
        found["runtime"] = json.loads(runtime.stdout.strip().splitlines()[-1]) if runtime.returncode == 0 else runtime.stderr[-2000:]
        Path(args.path).write_text(json.dumps(found, indent=1))
        return
    predicted = peaks([sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                       "--num_processes", "1"])
    if args.path:
        real = json.loads(Path(args.path).read_text())
        for recipe, figures in predicted.items():
            if recipe not in real:
                continue
            ratios = {kind: round(figures[kind] / real[recipe][kind], 4) for kind in figures if recipe in real}
            print(recipe, "predicted / real:", ratios)


if __name__ == "__main__":
    main()
