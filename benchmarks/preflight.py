"""What a dry run costs: torch's collective checks (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, on in every dry run so a
collective mismatch stops the run at once) and the mock CUDA device with its memory books, each against the same
dry run without it, side by side in one run.

The script trains a small MLP for ``--steps`` steps on 2 ranks under DDP (one all-reduce of the gradients per
step) and makes ``--collectives`` more small all-reduces, as a metrics loop would. Each variant runs
``--repeat`` times, interleaved; the medians and their ratios are printed.

    python benchmarks/preflight.py [--repeat 3] [--steps 50] [--collectives 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

SCRIPT = textwrap.dedent("""\
    import sys
    import torch
    from accelerate import Accelerator

    steps, collectives = int(sys.argv[1]), int(sys.argv[2])
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(steps):
        loss = model(torch.randn(32, 64, device=accelerator.device)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    for _ in range(collectives):
        accelerator.reduce(torch.ones(8, device=accelerator.device))
    """)

#: variant -> (--simulate family, TORCH_DISTRIBUTED_DEBUG)
VARIANTS = {
    "cpu, checks off": ("cpu", "OFF"),
    "cpu, checks on (dry-run default)": ("cpu", "DETAIL"),
    "mock cuda, checks on (dry-run default)": ("cuda", "DETAIL"),
}


def run(script: str, family: str, debug: str, steps: int, collectives: int) -> float:
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": debug}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", family,
                    "--num_processes", "2", "--timeout", "600", script, str(steps), str(collectives)],
                   env=env, check=True, capture_output=True, timeout=900)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--collectives", type=int, default=300)
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        with open(script, "w") as handle:
            handle.write(SCRIPT)
        for _ in range(args.repeat):
            for name, (family, debug) in VARIANTS.items():
                times[name].append(run(script, family, debug, args.steps, args.collectives))
    base = statistics.median(times["cpu, checks off"])
    print(f"2 ranks, {args.steps} DDP steps + {args.collectives} all-reduces, median of {args.repeat}:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<40} {median:6.2f} s  {median / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
