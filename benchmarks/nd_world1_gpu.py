"""Issue 34's GPU check: the ND setup matrix's training script (``nd.py``, HF's ``nd_parallel.py`` loop) at the one
layout a single GPU holds (dp_replicate, dp_shard, tp and cp all 1, world 1), its allocated and reserved peaks on a
real GPU and as the dry run reports them for the same script, and their ratio.

Each model runs two ways on the GPU: under ``accelerate launch --num_processes 1`` (HF runs it as one plain process:
``DistributedType.NO``) and under ``torchrun --nproc_per_node 1`` (one rank of a process group: ``MULTI_GPU``, DDP at
world 1). The dry run always runs its ranks in a process group, so it is held against both.

On the GPU (torch, HF accelerate 1.15 and Transformers; nothing of this project but this tree)::

    python benchmarks/nd_world1_gpu.py measure OUT     # OUT/summary.json as simulators.calibration reads one

Here, against what the GPU measured::

    python benchmarks/nd_world1_gpu.py compare OUT/summary.json [--no-compute]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "tests" / "accelerate_ref" / "commands"))

from nd_scripts import LLAMA, SAVE_LLAMA, SCRIPT, WORDS  # noqa: E402  (plain strings: no project import)

#: The models: the setup matrix's small Llama, and a 0.85-billion-parameter one of TinyLlama's width, whose model
#: states (13.6 GB) outweigh every workspace.
MODELS = {"small": LLAMA,
          "0.85b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "vocab_size": 32000}}
#: nd.py's arguments after the folder: dp_replicate, dp_shard, tp, cp, steps, decoder layer.
WORLD_ONE = ["1", "1", "1", "1", "2", "LlamaDecoderLayer"]
#: Runs ``nd.py`` (argv[1:]) in this process and writes its peaks to ``$ND_PEAKS``, and the caching allocator's
#: history of every allocation with its Python stack to ``$ND_SNAPSHOT`` (for pytorch.org/memory_viz).
MEASURE = textwrap.dedent("""\
    import json, os, runpy, sys

    import torch

    sys.argv = sys.argv[1:]
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    runpy.run_path(sys.argv[0], run_name="__main__")
    torch.cuda.memory._dump_snapshot(os.environ["ND_SNAPSHOT"])
    with open(os.environ["ND_PEAKS"], "w") as stream:
        json.dump({"peak": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}, stream)
    """)
#: The two ways a single-GPU user launches it.
LAUNCHERS = {"accelerate-launch": [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
                                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
             "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"]}


def _trained(output: str) -> str:
    """The last line in which nd.py said it trained (its distributed type), or ""."""
    return next((line for line in reversed(output.splitlines()) if "trained" in line), "")


def save(folder: Path, shape: dict) -> Path:
    """A Llama of ``shape`` with random weights and a tokenizer, saved to ``folder`` by the installed Transformers."""
    subprocess.run([sys.executable, "-c", SAVE_LLAMA, str(folder), "Llama", json.dumps(shape), WORDS], check=True,
                   capture_output=True, timeout=900)
    return folder


def measure(out: Path) -> dict:
    """Every model under every launcher on this machine's GPU: ``out/summary.json`` (``gpu``, ``runs``: per run its
    ``peak``, ``reserved`` and the distributed type the script printed) and ``out/<run>.pickle``, its allocations."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    truth = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="nd-world1-") as scratch:
        Path(scratch, "nd.py").write_text(SCRIPT)
        Path(scratch, "measure.py").write_text(MEASURE)
        for model, shape in MODELS.items():
            folder = save(Path(scratch, model), shape)
            for launcher, command in LAUNCHERS.items():
                peaks = Path(scratch, f"{model}-{launcher}.json")
                done = subprocess.run([*command, "measure.py", "nd.py", str(folder), *WORLD_ONE], cwd=scratch,
                                      capture_output=True, text=True, timeout=600,
                                      env={**os.environ, "ND_PEAKS": str(peaks), "OMP_NUM_THREADS": "1",
                                           "ND_SNAPSHOT": str(out / f"{model}-{launcher}.pickle")})
                if done.returncode or not peaks.exists():
                    print(f"{model} under {launcher} failed (exit {done.returncode}):\n{done.stderr[-3000:]}", flush=True)
                    continue
                truth["runs"][f"{model}-{launcher}"] = {**json.loads(peaks.read_text()), "printed": _trained(done.stdout)}
                print(model, launcher, truth["runs"][f"{model}-{launcher}"], flush=True)
    (out / "summary.json").write_text(json.dumps(truth, indent=1))
    return truth


def predict(gpu: str, *, no_compute: bool, models: tuple[str, ...] = tuple(MODELS)) -> dict[str, dict]:
    """Each of ``models`` (keys of :data:`MODELS`) as nd.py dry-runs it at world 1 on a mock GPU of ``gpu``'s kind:
    its peaks, and the line it printed."""
    from simulators.calibration import preset_of

    runs = {}
    with tempfile.TemporaryDirectory(prefix="nd-world1-") as scratch:
        Path(scratch, "nd.py").write_text(SCRIPT)
        for model in models:
            folder = save(Path(scratch, model), MODELS[model])
            command = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                       "--gpu", preset_of(gpu), "--num_processes", "1", "--summary-json", "summary.json",
                       *(["--no-compute"] if no_compute else []), "nd.py", str(folder), *WORLD_ONE]
            done = subprocess.run(command, cwd=scratch, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise RuntimeError(f"dry run of {model} failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
            devices = json.loads(Path(scratch, "summary.json").read_text())["ranks"][0]["memory"]
            books = max(devices.values(), key=lambda device: device["peak"])
            runs[model] = {"peak": books["peak"], "reserved": books.get("reserved", books["peak"]),
                           "printed": _trained(done.stdout)}
            Path(scratch, "summary.json").unlink()
    return runs


def compare(summary: Path, *, no_compute: bool) -> str:
    """The GPU's runs of ``summary`` against the dry run of the same model: a Markdown table."""
    from simulators.calibration import Row, load, table

    truth = load(summary)
    predicted = predict(truth["gpu"], no_compute=no_compute)
    rows = []
    for name, real in truth["runs"].items():
        dry = predicted[name.split("-")[0]]  # "<model>-<launcher>"
        rows.append(Row(f"{name} ({real['printed'].removeprefix('trained ')})", real["peak"], dry["peak"], real["reserved"],
                        dry["reserved"]))
    printed = "; ".join(f"{model}: {run['printed']}" for model, run in predicted.items())
    return f"{table(rows)}\n\ndry run ({'no compute' if no_compute else 'computing'}): {printed}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("measure").add_argument("out", type=Path)
    compared = commands.add_parser("compare")
    compared.add_argument("summary", type=Path)
    compared.add_argument("--no-compute", action="store_true")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out)
    else:
        print(compare(args.summary, no_compute=args.no_compute))


if __name__ == "__main__":
    main()
