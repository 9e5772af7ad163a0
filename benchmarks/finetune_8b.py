"""What an 8B fine-tune's dry run costs here: wall time and the largest process's resident memory, without compute.

The model is Llama-3-8B-shaped (hidden 4096, 32 layers, GQA 8 KV heads, vocabulary 128,256), saved locally as its
config and a bf16 safetensors file whose tensor bytes are a hole in a sparse file (the header is written, the 16 GB
after it are not): a dry run without compute never reads a large tensor's bytes
(``simulators.devices.no_compute.lazy_host``), so ``from_pretrained`` loads it as it would the real checkpoint.

Runs, each an unmodified recipe of ``tests/accelerate_ref/commands/finetune_scripts.py``
(``accelerate-ref launch --simulate cuda --no-compute --gpu a100-40gb``):

* ``qlora-nf4`` at 1 and 2 GPUs (a 4-bit NF4 base with double quantization, LoRA adapters, checkpointing);
* ``lora`` with FSDP2 (``--use_fsdp --fsdp_version 2``) at 1 and 2 GPUs;
* ``--fit 2`` of an 8B full fine-tune on 2 A100-40GB (``estimate-memory --training``).

Goals: each recipe under a minute and 2 GB; the fit under 10 minutes.

    python benchmarks/finetune_8b.py [--runs qlora-1 qlora-2 lora-fsdp-1 lora-fsdp-2 fit] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "accelerate_ref" / "commands"))

from finetune_scripts import RANK, RECIPES, SCRIPT, TARGETS  # noqa: E402  (plain strings: no project import)

#: Llama-3-8B's shapes.
LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": False, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
            "torch_dtype": "bfloat16"}
LAUNCH = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda", "--no-compute",
          "--gpu", "a100-40gb", "--timeout", "900"]
FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"]
#: run -> (recipe, processes, launch options).
RUNS = {
    "qlora-1": ("qlora-nf4", 1, []), "qlora-2": ("qlora-nf4", 2, []),
    "lora-fsdp-1": ("lora", 1, FSDP2), "lora-fsdp-2": ("lora", 2, FSDP2),
}


def _shapes(config: dict) -> dict[str, list[int]]:
    """Every weight of a Llama of ``config`` by name, with its shape."""
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = hidden // config["num_attention_heads"] * config["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden], "lm_head.weight": [vocab, hidden]}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update({prefix + "self_attn.q_proj.weight": [hidden, hidden], prefix + "self_attn.k_proj.weight": [kv, hidden],
                       prefix + "self_attn.v_proj.weight": [kv, hidden], prefix + "self_attn.o_proj.weight": [hidden, hidden],
                       prefix + "mlp.gate_proj.weight": [inner, hidden], prefix + "mlp.up_proj.weight": [inner, hidden],
                       prefix + "mlp.down_proj.weight": [hidden, inner], prefix + "input_layernorm.weight": [hidden],
                       prefix + "post_attention_layernorm.weight": [hidden]})
    return shapes


def save_sparse_checkpoint(folder: Path, config: dict) -> int:
    """Write ``config.json`` and a bf16 ``model.safetensors`` whose data is a hole (safetensors' layout: an 8-byte
    little-endian header length, the JSON header of offsets, then the bytes); the checkpoint's size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in _shapes(config).items():
        size = 2 * shape[0] * (shape[1] if len(shape) == 2 else 1)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(folder / "model.safetensors", "wb") as stream:
        stream.write(struct.pack("<Q", len(text)) + text)
        stream.truncate(8 + len(text) + offset)
    return offset


#: Runs a command and prints, last on stderr, the largest resident set (KiB) of the processes it waited for.
MEASURE = ("import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)")


def _timed(command: list[str]) -> dict:
    """Run ``command``; its wall seconds, exit status, the largest resident set of any process it started (ru_maxrss
    of the waited-for children, KiB on Linux) and its output's tail."""
    started = time.monotonic()
    measured = [sys.executable, "-c", MEASURE, *command]  # a process of its own: its children's peak is this run's
    done = subprocess.run(measured, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    rss = int(done.stderr.strip().splitlines()[-1]) * 1024
    lines = [line for line in done.stdout.splitlines() if line.startswith(("rank ", "[", "Fits", "None of"))
             and ("peak" in line or "Fits" in line or "None" in line or "/" in line[:6])]
    return {"seconds": round(time.monotonic() - started, 1), "exit": done.returncode, "max_rss": rss, "summary": lines,
            "tail": (done.stdout + done.stderr)[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=[*RUNS, "fit"], choices=[*RUNS, "fit"])
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="finetune-8b-") as work:
        folder = Path(work) / "llama-8b"
        size = save_sparse_checkpoint(folder, LLAMA_8B)
        print(f"8B checkpoint: {size / 1e9:.1f} GB of bf16 weights as a sparse file", flush=True)
        for run in args.runs:
            if run == "fit":
                command = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "estimate-memory", str(folder),
                           "--training", "--num_processes", "2", "--gpu", "a100-40gb", "--mixed_precision", "bf16",
                           "--batch_size", "1", "--seq_len", "2048", "--fit", "2"]
            else:
                recipe, processes, options = RUNS[run]
                quantization, checkpointing = RECIPES[recipe]
                script = Path(work) / f"{recipe}.py"
                script.write_text(SCRIPT.format(quantization=quantization, checkpointing=checkpointing, rank=RANK,
                                                targets=list(TARGETS)))
                command = [*LAUNCH, "--num_processes", str(processes), *options, str(script), str(folder)]
            results[run] = _timed(command)
            found = results[run]
            print(f"{run}: exit {found['exit']}, {found['seconds']} s, largest process {found['max_rss'] / 2**30:.2f} GiB",
                  flush=True)
            print("\n".join(found["summary"]) if not found["exit"] else found["tail"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))


if __name__ == "__main__":
    main()
