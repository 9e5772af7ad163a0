"""The rank pool against a fresh launch per case, side by side in one run.

Runs the same cases at the same world twice: through the persistent rank
pool of the `sim` backend (ranks start once), and with a fresh launch of
every rank for every case (as a suite built on `accelerate launch` per
script does). Prints both totals, their ratio (goal: the pool at least 20x
faster) and the pool's own per-case overhead: wall time per case minus the
time the case itself took inside the slowest rank.

    python benchmarks/suite_speed.py [--impl accelerate_ref] [--world 2] [-k PATTERN ...] [--fresh-sample 6]

A fresh launch costs seconds, so by default only a sample of the cases is
launched fresh and the fresh total is scaled to the full count (printed as such).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import simulators
from conformance.engine import worker
from conformance.engine.backends import SimBackend
from conformance.engine.case import all_cases, select
from simulators.topology import World


def run_case_in_fresh_ranks(impl: str, key: str, world_label: str, shared_dir: str) -> dict:
    """What a rank of a fresh launch does: import the implementation, run one case."""
    os.environ.update({**SimBackend.base_env, "ACCELERATE_IMPL": impl})
    return worker.run_case(key, world_label, shared_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="accelerate_ref")
    parser.add_argument("--world", default="2")
    parser.add_argument("-k", dest="patterns", action="append", default=[])
    parser.add_argument("--fresh-sample", type=int, default=6, help="cases to launch fresh (0: all)")
    args = parser.parse_args(argv)

    world = World.parse(args.world)
    cases = [c for c in select(all_cases(), args.patterns) if c.runs_at(world.label) and not c.env]
    if not cases:
        print("no case selected", file=sys.stderr)
        return 2
    print(f"suite_speed: impl={args.impl} world={world.label} cases={len(cases)}")

    backend = SimBackend(args.impl, case_timeout=60.0)
    started = time.perf_counter()
    pool_results = [backend.run_case(case, world) for case in cases]
    pool_total = time.perf_counter() - started
    backend.close()
    first = pool_results[0].duration_s
    steady = [r.duration_s for r in pool_results[1:]] or [first]

    sample = cases if args.fresh_sample <= 0 else cases[: args.fresh_sample]
    fresh_times = []
    with tempfile.TemporaryDirectory(prefix="suite-speed-") as shared:
        for case in sample:
            t0 = time.perf_counter()
            simulators.run(
                run_case_in_fresh_ranks, world=world.size, machines=world.machines,
                args=(args.impl, case.key, world.label, shared), timeout=300,
            )
            fresh_times.append(time.perf_counter() - t0)
    fresh_per_case = statistics.mean(fresh_times)
    fresh_total = fresh_per_case * len(cases)

    in_rank = [max((rank.duration_s for rank in r.ranks), default=0.0) for r in pool_results[1:]] or [0.0]
    overhead = statistics.median(s - i for s, i in zip(steady, in_rank))
    bad = [r for r in pool_results if r.status.value not in ("PASS", "XFAIL", "NOT_SUPPORTED")]
    print(f"pool : {pool_total:7.2f} s for {len(cases)} cases (first case incl. pool start {first:.2f} s, "
          f"then median {statistics.median(steady) * 1000:.1f} ms per case)")
    print(f"fresh: {fresh_total:7.2f} s for {len(cases)} cases (mean {fresh_per_case:.2f} s per launch, "
          f"{'measured on all' if len(sample) == len(cases) else f'measured on {len(sample)}, scaled'})")
    print(f"ratio fresh/pool: {fresh_total / pool_total:.1f}x   (goal >= 20x)")
    print(f"pool overhead per case (wall - case time in slowest rank, median): {overhead * 1000:.1f} ms")
    if bad:
        print(f"note: {len(bad)} case(s) did not pass: {', '.join(f'{r.id}={r.status.value}' for r in bad)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
