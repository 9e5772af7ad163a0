"""What a compute-mode dry run costs against the same script run plainly on the CPU (issue 33, item 5): for each
model of ``benchmarks/preflight_models.py`` (one AdamW training step twice), side by side in one run,

* (a) ``cpu fp32``: the script run plainly (``python benchmarks/preflight_models.py M``; no GPU, so it runs on
  the CPU) in fp32;
* (b) ``dry fp32``: the same as a compute-mode dry run on one mock GPU
  (``accelerate-ref launch --simulate cuda --num_processes 1 benchmarks/preflight_models.py M``);
* (c) ``dry bf16``: the dry run with ``--bf16`` (bf16 autocast; the mock computes a bf16 matrix product in fp32 and
  rounds it once, as a GPU does: :mod:`simulators.devices.kernels.lowp_matmul`).

Goal: (b) and (c) at most 1.5x (a). All three run with ``OMP_NUM_THREADS=1``: a dry run's ranks compute on one
thread (``simulators.dryrun.family_env``), so the plain run gets the same. Each variant runs ``--repeat`` times,
interleaved; the table gives the medians of the seconds the script measures itself (``seconds`` in its JSON line:
the wrapping and the two steps, no interpreter or launcher start) and of the wall time of the whole command, and
the ratios b/a and c/a of each.

    python benchmarks/dry_run_cost.py [--models mlp transformer encoder] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preflight_models.py")
LAUNCH = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", "cuda",
          "--num_processes", "1", "--timeout", "1800"]
#: variant -> the command before the model's arguments, and the arguments it adds.
VARIANTS = {
    "cpu fp32": ([sys.executable, MODELS], []),
    "dry fp32": ([*LAUNCH, MODELS], []),
    "dry bf16": ([*LAUNCH, MODELS], ["--bf16"]),
}


def run(variant: str, model: str, batch: int) -> tuple[float, float]:
    """The script's own seconds and the command's wall seconds for one run of ``variant`` on ``model``."""
    prefix, extra = VARIANTS[variant]
    started = time.perf_counter()
    done = subprocess.run([*prefix, model, "--batch", str(batch), *extra], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=2400)
    wall = time.perf_counter() - started
    lines = [line.split("] ", 1)[-1] for line in done.stdout.splitlines() if "{" in line]
    reports = [json.loads(line) for line in lines if line.startswith("{")]
    if done.returncode or not reports:
        raise SystemExit(f"{variant} {model} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return reports[0]["seconds"], wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer", "encoder"],
                        choices=["mlp", "conv", "transformer", "encoder", "embedding"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'model':<13}{'variant':<10}{'script s':>10}{'wall s':>9}{'script x':>10}{'wall x':>8}   "
          f"(medians of {args.repeat}; x: against cpu fp32; goal: dry runs <= 1.5x)", flush=True)
    for model in args.models:
        times: dict[str, list[tuple[float, float]]] = {variant: [] for variant in args.variants}
        for _ in range(args.repeat):
            for variant in args.variants:
                times[variant].append(run(variant, model, args.batch))
        medians = {variant: (statistics.median(s for s, _ in runs), statistics.median(w for _, w in runs))
                   for variant, runs in times.items()}
        base = medians.get("cpu fp32")
        for variant, (script, wall) in medians.items():
            ratios = f"{script / base[0]:>10.2f}{wall / base[1]:>8.2f}" if base else ""
            print(f"{model:<13}{variant:<10}{script:>10.2f}{wall:>9.2f}{ratios}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
