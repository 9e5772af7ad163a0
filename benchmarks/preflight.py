"""What a dry run costs: the mock CUDA device with its memory books, the Flight Recorder watch (which stops a
collective mismatch within a second) and torch's collective checks (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which
would too), each against the same dry run on the CPU without them, side by side in one run. A variant that crashes is reported with its exit status
(on torch 2.13's CPU build DETAIL crashes DDP's construction: why dry runs leave it off).

The script trains a small MLP for ``--steps`` steps on 2 ranks under DDP (one all-reduce of the gradients per
step) and makes ``--collectives`` more small all-reduces, as a metrics loop would. Each variant runs
``--repeat`` times, interleaved; the medians and their ratios are printed.

With ``--accuracy`` it compares instead, for each model of ``benchmarks/preflight_models.py`` at world 1 and
under DDP and FSDP2 at 2 and 4 ranks, rank 0's peak as a dry run on mock GPUs reports it with the peak torch's
own MemTracker measures for the same two steps, on the same mock GPUs (the same program: goal within 10%) and,
independently of the mock, on the CPU with gloo (neither counts what gloo allocates inside a collective: NCCL's
buffers are not torch's).

With ``--against SUMMARY`` it holds the dry run against a real GPU instead (:mod:`simulators.calibration`): the
script that measured ``SUMMARY`` (``capture.py`` beside it) dry-run on a mock GPU of the same kind, and for every
run its allocated and reserved peaks, real, predicted and their ratio (``--no-compute`` for the no-compute dry run).

    python benchmarks/preflight.py [--repeat 3] [--steps 50] [--collectives 300]
    python benchmarks/preflight.py --accuracy [--models mlp conv transformer encoder embedding] [--worlds 1 2 4]
    python benchmarks/preflight.py --against ../shared/gpu/summary.json [--no-compute]
"""

from __future__ import annotations

import argparse
import json
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
    if steps:
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(steps):  # 0: no DDP model is made
        loss = model(torch.randn(32, 64, device=accelerator.device)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    for _ in range(collectives):
        accelerator.reduce(torch.ones(8, device=accelerator.device))
    """)

#: The Flight Recorder watch off (a dry run reads the ranks' recorders every second by default).
NO_WATCH = {"SIMULATORS_WATCH_INTERVAL": "0"}
DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
#: variant -> (--simulate family, environment, DDP training steps or none)
VARIANTS = {
    "cpu, no watch (baseline)": ("cpu", NO_WATCH, True),
    "cpu (dry-run default: watch)": ("cpu", {}, True),
    "mock cuda (dry-run default)": ("cuda", {}, True),
    "cpu, checks on, no watch": ("cpu", {**DETAIL, **NO_WATCH}, True),
    "cpu, collectives only, no watch": ("cpu", NO_WATCH, False),
    "cpu, collectives only": ("cpu", {}, False),
    "cpu, collectives only, checks on, no watch": ("cpu", {**DETAIL, **NO_WATCH}, False),
}


def run(script: str, family: str, extra: dict[str, str], steps: int, collectives: int) -> tuple[float, int]:
    """Seconds the dry run took, and its exit status."""
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "OFF", **extra}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", family,
                           "--num_processes", "2", "--timeout", "600", script, str(steps), str(collectives)],
                          env=env, capture_output=True, timeout=900)
    return time.perf_counter() - started, done.returncode


MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preflight_models.py")


def _launch(family: str, world: int, arguments: list[str], summary: str | None = None) -> str:
    """Run ``preflight_models.py arguments`` on ``world`` ranks of ``family``; its output."""
    command = [sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--simulate", family,
               "--num_processes", str(world), "--timeout", "900"]
    done = subprocess.run([*command, *(["--summary-json", summary] if summary else []), MODELS, *arguments],
                          capture_output=True, text=True, timeout=1200)
    if done.returncode:
        raise SystemExit(f"{' '.join(arguments)} on {world} {family} rank(s) failed:\n{done.stdout[-3000:]}")
    return done.stdout


def _tracked(output: str) -> int:
    """Rank 0's MemTracker peak in a launch's output."""
    line = next(line for line in output.splitlines() if line.startswith("[rank 0] {"))
    return json.loads(line.split(" ", 2)[2])["peak"]


def accuracy(models: list[str], worlds: list[int], setups: list[str], trackers: list[str]) -> None:
    """Per model, world and setup: rank 0's dry-run peak on a mock GPU against MemTracker's peak for the same
    script on the same mock GPU (``mock``), and on the CPU (``cpu``, gloo's ranks)."""
    header = "".join(f"{f'MemTracker, {where}':>18}{'ratio':>8}" for where in trackers)
    print(f"{'model':<13}{'setup':<7}{'ranks':>6}{'dry run':>15}{header}", flush=True)
    for model in models:
        for world in worlds:
            for setup in (["none"] if world == 1 else setups):
                arguments = [model, "--distributed", setup]
                with tempfile.TemporaryDirectory() as folder:
                    summary = os.path.join(folder, "summary.json")
                    _launch("cuda", world, arguments, summary)
                    with open(summary) as handle:
                        dry = max(device["peak"] for device in json.load(handle)["ranks"][0]["memory"].values())
                row = f"{model:<13}{setup:<7}{world:>6}{dry:>15,}"
                for where in trackers:
                    tracked = _tracked(_launch("cuda" if where == "mock" else "cpu", world, [*arguments, "--memtracker"]))
                    row += f"{tracked:>18,}{dry / tracked:>8.4f}"
                print(row, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accuracy", action="store_true", help="compare peaks with torch's MemTracker instead")
    parser.add_argument("--models", nargs="+", default=["mlp", "conv", "transformer", "encoder", "embedding"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--setups", nargs="+", choices=["ddp", "fsdp2"], default=["ddp", "fsdp2"])
    parser.add_argument("--trackers", nargs="+", choices=["mock", "cpu"], default=["mock", "cpu"])
    parser.add_argument("--against", metavar="SUMMARY", help="compare with a real GPU's summary.json instead")
    parser.add_argument("--no-compute", action="store_true", help="with --against: a no-compute dry run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--collectives", type=int, default=300)
    args = parser.parse_args(argv)
    if args.against:
        from simulators import calibration

        truth = calibration.load(args.against)
        print(f"{truth['gpu']}, torch {truth['torch']}: the dry run (--simulate cuda --gpu "
              f"{calibration.preset_of(truth['gpu'])}{', --no-compute' if args.no_compute else ''}) against it", flush=True)
        print(calibration.table(calibration.compare(truth, calibration.predict(args.against, no_compute=args.no_compute))))
        return 0
    if args.accuracy:
        accuracy(args.models, args.worlds, args.setups, args.trackers)
        return 0
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    failed: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "train.py")
        with open(script, "w") as handle:
            handle.write(SCRIPT)
        for _ in range(args.repeat):
            for name, (family, extra, train) in VARIANTS.items():
                seconds, status = run(script, family, extra, args.steps if train else 0, args.collectives)
                times[name].append(seconds)
                if status:
                    failed[name] = status
    base = statistics.median(times["cpu, no watch (baseline)"])
    only = statistics.median(times["cpu, collectives only, no watch"])
    print(f"2 ranks, {args.steps} DDP steps + {args.collectives} all-reduces (or the all-reduces only), median of {args.repeat}:")
    for name, values in times.items():
        median = statistics.median(values)
        versus = only if "collectives only" in name else base
        state = f"  CRASHED (exit {failed[name]})" if name in failed else ""
        print(f"  {name:<36} {median:6.2f} s  {median / versus:5.2f}x{state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
