"""Start-up cost of a 2-rank launch: `accelerate-ref launch`, `accelerate launch` and plain torchrun.

Each launcher runs a no-op script (it imports nothing) on 2 ranks of this host,
``--repeat`` times, interleaved so that load changes hit all three alike; the
median wall time of each is printed with the ratios (goals: accelerate-ref
within 1.1x of torchrun, and at most HF's). HF's `--multi_gpu` is used for its
2 ranks, since its `--cpu` starts one process (accelerate issue #2741).

    python benchmarks/launch.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from accelerate_ref.utils._other.ports import get_free_port as free_port


def commands(script: str) -> dict[str, list[str]]:
    python = sys.executable
    found = {
        "torchrun": lambda port: [python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), "--monitor_interval", "0.1", script],
        "accelerate-ref launch": lambda port: [python, "-m", "accelerate_ref.commands.accelerate_cli", "launch", "--cpu", "-n", "2", "--main_process_port", str(port), script],
    }
    if shutil.which("accelerate") or os.path.exists(os.path.join(os.path.dirname(python), "accelerate")):
        found["accelerate launch"] = lambda port: [
            python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port), script]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "noop.py")
        with open(script, "w") as handle:
            handle.write("pass\n")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HOME": os.path.join(folder, "hf")}
        launchers = commands(script)
        times: dict[str, list[float]] = {name: [] for name in launchers}
        for _ in range(options.repeat):
            for name, make in launchers.items():
                started = time.perf_counter()
                subprocess.run(make(free_port()), env=env, check=True, timeout=300, capture_output=True)
                times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    for name, value in median.items():
        print(f"{name:<24} median {value:6.2f} s  (runs: {', '.join(f'{v:.2f}' for v in times[name])})")
    ref = median["accelerate-ref launch"]
    print(f"accelerate-ref / torchrun: {ref / median['torchrun']:.2f}x (goal <= 1.10x)")
    if "accelerate launch" in median:
        print(f"accelerate-ref / accelerate launch: {ref / median['accelerate launch']:.2f}x (goal <= 1.00x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
