"""What no-compute mode costs and saves (issue 23): the same training steps dry-run on mock GPUs with values
(compute) and without (``--no-compute``), side by side in one run, then the large models only no-compute reaches.

The script is ``estimate-memory --training``'s (:mod:`accelerate_ref.commands.estimate_training`): a Llama built
empty from a ``transformers`` config, sharded with accelerate_ref's FSDP2 (bf16 mixed precision), ``--steps``
AdamW steps on random tokens (one by default, the issue's measure; ``estimate-memory`` runs two). Each rank prints
its host memory (``ru_maxrss``) after the steps; the table gives the launch's wall time, the largest rank's host
memory (peak RSS, and PSS at the end) and rank 0's device peak, and for models that fit both ways the ratios
(compute / no-compute) and whether the peaks agree. Every run then checks rank 0's model states at the end of a
step against FSDP2's arithmetic: each parameter's dim 0 split in ``ranks`` rows of ceil(dim 0 / ranks), fp32
parameters and gradients, AdamW's two fp32 moments (and the step counters, a 4-byte fp32 tensor each).

    python benchmarks/no_compute.py                       # a 0.1B Llama at 2 ranks, both modes (one run)
    python benchmarks/no_compute.py --scale 7b            # 7B at 8 ranks and at 16 ranks as 2 machines
    python benchmarks/no_compute.py --scale 70b           # 70B at 64 ranks as 8 machines

``--as-written`` (issue 33, item 4) times a script as most are written instead: HF accelerate's ``Accelerator``
(bf16), the Llama built on the CPU (``LlamaForCausalLM(config)``, its initialisation included), AdamW made
before ``prepare`` moves the model (DDP), ``--steps`` (two by default) steps on batches of 1 x ``--seq-len``
random tokens; in no-compute mode the CPU model is lazy (:mod:`simulators.devices.no_compute.lazy_host`). Per run: wall
seconds, each rank's CPU seconds, its peak RSS (the largest, and the sum over ranks: pages the ranks share with
the fork server they came from count in each), the largest at the end in PSS (shared pages divided among their
processes), the whole launch's peak of PSS summed over its processes (sampled every 0.2 s: the host memory the
run took), rank 0's device peak; for the models that run both ways whether every rank's books agree::

    python benchmarks/no_compute.py --as-written                # a small Llama (2 layers, hidden 256) at 2 ranks, both modes
    python benchmarks/no_compute.py --as-written --scale 7b     # 7B at 8 ranks, no compute
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

from accelerate_ref.commands.estimate_training import SCRIPT

#: name -> LlamaConfig keyword arguments.
MODELS = {
    "small": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 32000},
    "0.1b": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 12,
             "num_key_value_heads": 12, "vocab_size": 32000},
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "vocab_size": 32000},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "vocab_size": 32000},
}
#: --scale -> the (model, ranks, machines) runs it makes.
SCALES = {"small": [("0.1b", 2, 1)], "7b": [("7b", 8, 1), ("7b", 16, 2)], "70b": [("70b", 64, 8)]}
#: --scale -> the (model, ranks) runs of --as-written (both modes for "small", no compute for the others).
AS_WRITTEN_SCALES = {"small": [("small", 2)], "7b": [("7b", 8)], "70b": [("70b", 64)]}
#: --as-written's script; ``sys.argv``: model folder, sequence length, steps, attention implementation.
AS_WRITTEN = textwrap.dedent("""\
    import resource
    import sys
    import time

    import torch
    from accelerate import Accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    folder, length, steps, attention = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    accelerator = Accelerator(mixed_precision="bf16")
    config = LlamaConfig.from_pretrained(folder, attn_implementation=attention)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(steps):
        batch = torch.randint(0, config.vocab_size, (1, length), device=accelerator.device)
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print("cpu seconds", time.process_time(), flush=True)
    """)
#: Appended to the script: each rank's peak resident memory and, at the end, its proportional share (PSS: pages it
#: shares with other processes, torch's libraries, divided among them), in bytes.
RSS = textwrap.dedent("""\
    import resource
    pss = [line.split()[1] for line in open("/proc/self/smaps_rollup") if line.startswith("Pss:")][0]
    print("host memory", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, int(pss) * 1024, flush=True)
    """)


def dry_run(folder: str, script: str, ranks: int, machines: int, no_compute: bool, batch: int, length: int, steps: int) -> dict:
    """One dry run of ``script`` on ``folder``'s model: wall seconds, the most host memory a rank used, rank 0's
    device peak and model states, the exit status."""
    with tempfile.TemporaryDirectory() as work:
        summary = os.path.join(work, "summary.json")
        command = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                   *(["--no-compute"] if no_compute else []), "--num_processes", str(ranks), "--num_machines", str(machines),
                   "--mixed_precision", "bf16", "--timeout", "1800", "--summary-json", summary,
                   script, folder, "fsdp", str(batch), str(length), str(steps)]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        seconds = time.perf_counter() - started
        if done.returncode or not os.path.exists(summary):
            raise SystemExit(f"{ranks} ranks, no_compute={no_compute} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
        with open(summary) as stream:
            rank0 = json.load(stream)["ranks"][0]
    device = max(rank0["memory"].values(), key=lambda books: books["peak"])
    host = [(int(rss), int(pss)) for rss, pss in re.findall(r"host memory (\d+) (\d+)", done.stdout)]
    return {"seconds": seconds, "host": max(rss for rss, _ in host), "pss": max(pss for _, pss in host),
            "peak": device["peak"], "states": device["model_states"]}


def arithmetic(config: dict, ranks: int) -> dict[str, int]:
    """Bytes of each model-state part on one rank of FSDP2 with AdamW, from the model's parameter shapes."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, tie_word_embeddings=False))
    shard = sum(math.ceil(param.shape[0] / ranks) * param[0].numel() for param in model.parameters()) * 4
    counters = 4 * len(list(model.parameters()))  # AdamW's step, a 0-dim fp32 tensor per parameter
    return {"trainable_parameters": shard, "frozen_parameters": 0, "quantized_weights": 0, "gradients": shard, "optimizer_state": 2 * shard + counters}


def check_states(name: str, ranks: int, states: dict[str, int]) -> str:
    """``exact`` when ``states`` are the arithmetic to the byte, else the parts that differ."""
    expected = arithmetic(MODELS[name], ranks)
    wrong = [f"{part} {states[part]:,} (arithmetic {size:,})" for part, size in expected.items() if states[part] != size]
    return "exact" if not wrong else "DIFFERS: " + "; ".join(wrong)


class TreeMemory:
    """Samples a process and its descendants every ``interval`` seconds while it runs: the peak of their PSS summed
    (the host memory the whole launch takes, each shared page counted once) and of their RSS summed."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import psutil

        self.root, self.interval = psutil.Process(pid), interval
        self.pss = self.rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        while not self._stop.is_set():
            pss = rss = 0
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for process in processes:
                try:
                    memory = process.memory_full_info()
                except psutil.Error:  # ended between the listing and the reading
                    continue
                pss, rss = pss + memory.pss, rss + memory.rss
            self.pss, self.rss = max(self.pss, pss), max(self.rss, rss)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def as_written_run(folder: str, script: str, ranks: int, no_compute: bool, length: int, steps: int, attention: str) -> dict:
    """One dry run of the --as-written script: wall seconds, per-rank CPU seconds and host memory, the launch's
    peak PSS, every rank's books."""
    with tempfile.TemporaryDirectory() as work:
        summary = os.path.join(work, "summary.json")
        command = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
                   *(["--no-compute"] if no_compute else []), "--num_processes", str(ranks), "--timeout", "1800",
                   "--summary-json", summary, script, folder, str(length), str(steps), attention]
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        tree = TreeMemory(process.pid)
        output, _ = process.communicate()
        seconds = time.perf_counter() - started
        tree.stop()
        if process.returncode or not os.path.exists(summary):
            raise SystemExit(f"{ranks} ranks, no_compute={no_compute} failed (exit {process.returncode}):\n{output[-3000:]}")
        with open(summary) as stream:
            books = [rank["memory"] for rank in json.load(stream)["ranks"]]
    host = [(int(rss), int(pss)) for rss, pss in re.findall(r"host memory (\d+) (\d+)", output)]
    cpu = [float(value) for value in re.findall(r"cpu seconds ([0-9.]+)", output)]
    return {"seconds": seconds, "cpu": cpu, "rss": [rss for rss, _ in host], "pss": [pss for _, pss in host],
            "tree_pss": tree.pss, "tree_rss": tree.rss, "books": books,
            "peak": max(device["peak"] for device in books[0].values())}


def as_written(args: argparse.Namespace) -> int:
    """--as-written: see the module docstring."""
    import transformers

    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "train.py")
        with open(script, "w") as stream:
            stream.write(AS_WRITTEN + RSS)
        print(f"{'model':<6}{'ranks':>6}{'mode':>12}{'wall s':>8}{'CPU s/rank':>11}{'RSS MB max':>11}{'RSS MB sum':>11}"
              f"{'PSS MB max':>11}{'launch PSS MB':>14}{'device peak MB':>15}", flush=True)
        for name, ranks in AS_WRITTEN_SCALES[args.scale]:
            folder = os.path.join(work, name)
            transformers.LlamaConfig(**MODELS[name]).save_pretrained(folder)
            found = {}
            for no_compute in ([False, True] if name == "small" else [True]):
                found[no_compute] = run = as_written_run(folder, script, ranks, no_compute, args.seq_len, args.steps or 2,
                                                         args.attention)
                mode = "no-compute" if no_compute else "compute"
                print(f"{name:<6}{ranks:>6}{mode:>12}{run['seconds']:>8.1f}{max(run['cpu']):>11.1f}"
                      f"{max(run['rss']) / 1e6:>11.0f}{sum(run['rss']) / 1e6:>11.0f}{max(run['pss']) / 1e6:>11.0f}"
                      f"{run['tree_pss'] / 1e6:>14.0f}{run['peak'] / 1e6:>15.1f}", flush=True)
            if len(found) == 2:
                same = found[False]["books"] == found[True]["books"]
                print("  every rank's books (peak, reserved, parts, step, line):", "the same" if same else
                      f"DIFFER: compute {json.dumps(found[False]['books'][0])}; no-compute {json.dumps(found[True]['books'][0])}",
                      flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=list(SCALES), default="small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 1; --as-written: 2)")
    parser.add_argument("--as-written", action="store_true", help="the script as most are written: the model built on the CPU")
    parser.add_argument("--attention", default="sdpa", help="--as-written: the Llama's attn_implementation (default sdpa)")
    args = parser.parse_args(argv)
    if args.as_written:
        return as_written(args)
    args.steps = args.steps or 1
    import transformers

    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "train.py")
        with open(script, "w") as stream:
            stream.write(SCRIPT + RSS)
        print(f"{'model':<6}{'ranks':>6}{'machines':>9}{'mode':>12}{'wall s':>9}{'RSS MB/rank':>13}{'PSS MB/rank':>13}"
              f"{'device peak MB':>16}  model states (rank 0)", flush=True)
        for name, ranks, machines in SCALES[args.scale]:
            folder = os.path.join(work, name)
            transformers.LlamaConfig(**MODELS[name], tie_word_embeddings=False).save_pretrained(folder)
            modes = [False, True] if args.scale == "small" else [True]
            found = {}
            for no_compute in modes:
                found[no_compute] = run = dry_run(folder, script, ranks, machines, no_compute, args.batch, args.seq_len, args.steps)
                mode = "no-compute" if no_compute else "compute"
                print(f"{name:<6}{ranks:>6}{machines:>9}{mode:>12}{run['seconds']:>9.1f}{run['host'] / 2**20:>13.0f}{run['pss'] / 2**20:>13.0f}"
                      f"{run['peak'] / 2**20:>16.1f}  {check_states(name, ranks, run['states'])}", flush=True)
            if len(found) == 2:
                compute, none = found[False], found[True]
                print(f"  compute / no-compute: wall {compute['seconds'] / none['seconds']:.2f}x, host memory "
                      f"{compute['host'] / none['host']:.2f}x, device peak {compute['peak'] / none['peak']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
