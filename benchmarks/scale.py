"""Rank start-up time and memory at 8, 16, 32 and 64 ranks: spawned vs forked ranks, side by side.

Issue 14's goal: 64 ranks start in under 4x the time of 8, and total PSS at 64 ranks stays
under 6 GB (under 95 MB a rank). For each start method and world size, one pool like the
conformance suite's (torch, the implementation and the worker imported, setup run) is
started and timed; then every rank's PSS (``psutil``, shared pages divided among sharers) is
summed, with the fork server's, idle and again after one collective case
(``gather.first_dim``: a gloo process group over the whole world). Heavy: run it alone,
under ``flock /work/wt/heavy.lock``. Timings on a shared machine are upper bounds.

    python benchmarks/scale.py [--sizes 8,16,32,64] [--impl accelerate_ref]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time

import psutil

from conformance.engine.backends import RENDEZVOUS_S_PER_RANK
from conformance.engine.case import find
from simulators.pool import RankPool
from simulators.topology import World

CASE = "conformance.cases.test_collectives:gather_first_dim"
MB = 2**20


def _pss(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_full_info().pss for pid in pids)


def measure(method: str, size: int, impl: str) -> dict[str, float]:
    """Start a pool of ``size`` ranks with ``method``; its start time and PSS idle and after one case."""
    world = World.of(size)
    pool = RankPool(world, setup="conformance.engine.worker:setup", start_method=method, start_timeout=600.0,
                    env={"ACCELERATE_USE_CPU": "1", "ACCELERATE_IMPL": impl},
                    preload=["torch", "torch.distributed", "conformance.engine.worker", impl], pythonpath=sys.path)
    shared = tempfile.mkdtemp(prefix="scale-")
    try:
        started = time.perf_counter()
        pool.start()
        start_s = time.perf_counter() - started
        pids = [rank.pid for rank in pool._ranks] + ([pool._zygote._proc.pid] if pool._zygote else [])
        idle = _pss(pids)
        find(CASE)
        result = pool.run("conformance.engine.worker:run_case", (CASE, world.label, shared),
                          timeout=60.0 + RENDEZVOUS_S_PER_RANK * size)
        statuses = {outcome.value["status"] for outcome in result.outcomes.values() if outcome.ok}
        busy = _pss(pids) if result.status == "ok" else float("nan")
        return {"start_s": start_s, "case_s": result.duration_s, "idle_mb": idle / MB, "busy_mb": busy / MB,
                "ok": result.status == "ok" and statuses == {"PASS"}}
    finally:
        pool.close()
        shutil.rmtree(shared, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--methods", default="spawn,fork")
    parser.add_argument("--impl", default="accelerate_ref")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    rows = {}
    for method in args.methods.split(","):
        for size in sizes:
            rows[method, size] = measure(method, size, args.impl)
            row = rows[method, size]
            print(f"{method:>5} {size:>3} ranks: start {row['start_s']:6.1f} s  first case {row['case_s']:5.1f} s  "
                  f"PSS idle {row['idle_mb']:7.0f} MB ({row['idle_mb'] / size:5.1f}/rank)  "
                  f"after a case {row['busy_mb']:7.0f} MB ({row['busy_mb'] / size:5.1f}/rank)  "
                  f"{'ok' if row['ok'] else 'CASE FAILED'}", flush=True)
    print("\n| ranks | " + " | ".join(f"{m} start s | {m} PSS MB/rank (idle, after a case)" for m in args.methods.split(",")) + " |")
    print("|---|" + "---|---|" * len(args.methods.split(",")))
    for size in sizes:
        cells = []
        for method in args.methods.split(","):
            row = rows[method, size]
            cells += [f"{row['start_s']:.1f}", f"{row['idle_mb'] / size:.0f}, {row['busy_mb'] / size:.0f}"]
        print(f"| {size} | " + " | ".join(cells) + " |")
    for method in args.methods.split(","):
        if 8 in sizes and 64 in sizes:
            ratio = rows[method, 64]["start_s"] / rows[method, 8]["start_s"]
            print(f"{method}: start at 64 / start at 8 = {ratio:.2f} (goal < 4); "
                  f"total PSS at 64 after a case = {rows[method, 64]['busy_mb'] / 1024:.2f} GB (goal < 6)")
    return 0 if all(row["ok"] for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
