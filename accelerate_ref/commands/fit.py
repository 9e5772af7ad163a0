"""``accelerate-ref launch --simulate cuda --fit N`` (and ``estimate-memory --training --fit N``): when a run does
not fit, the launch options users reach for, tried.

Rule: the script is dry-run without compute (``--no-compute``, two optimizer steps unless ``--steps`` says
otherwise) once per option set, in the order the options cost (`ladder`), each as the launch line it would be
(a run of its own, judged by the summary's verdict: the reserved peak of the worst rank against the card less
what its runtime holds). The sets, each on top of the one before:

1. the launch as given;
2. FSDP2, full shard, each decoder layer a unit (``--use_fsdp --fsdp_version 2 --fsdp_auto_wrap_policy
   TRANSFORMER_BASED_WRAP``), unless the launch already shards with FSDP or DeepSpeed;
3. activation checkpointing of those units (``--fsdp_activation_checkpointing true``);
4. more processes, doubling up to ``N`` (``--fit N``; none when ``N`` is the processes given);
5. CPU offload of parameters, gradients and optimizer state (``--fsdp_offload_params true``), at the processes
   given;
6. DeepSpeed ZeRO-3 (``--use_deepspeed --zero_stage 3``) at the processes given, where deepspeed is installed
   and the launch does not ask for FSDP itself.

The trials stop at the first set that fits: every later one costs more. Then one table: the sets tried, the one
that fits first, each with its processes, peak, reserved peak (for a set that ran out of memory, what it held
before), verdict, headroom and launch options; then the options that fit, or one line saying none did (exit 1). Refused before any run (one line, exit 2): ``--fit``
without a budget (``--gpu`` or ``--device-memory``), on a family other than ``cuda``, or with ``N`` below the
processes given.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass

from simulators.dryrun import DEFAULT_TIMEOUT
from simulators.fork_root import run_module


@dataclass(frozen=True)
class OptionSet:
    """One row of the ladder: what it adds, the launch options it is, and the processes it runs on."""

    name: str
    flags: tuple[str, ...]
    processes: int


FSDP2 = ("--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
CHECKPOINTING = ("--fsdp_activation_checkpointing", "true")
OFFLOAD = ("--fsdp_offload_params", "true")
ZERO3 = ("--use_deepspeed", "--zero_stage", "3")
#: Seconds a trial's launch may take past its own deadline (starting, and stopping its ranks) before it is given up.
LAUNCH_GRACE = 120
#: The module each trial runs (``accelerate-ref``'s command line).
CLI_MODULE = "accelerate_ref.commands.accelerate_cli"


def ladder(args: argparse.Namespace) -> list[OptionSet]:
    """The option sets ``--fit`` tries for the launch ``args``, cheapest first (see the module docstring)."""
    given = args.num_processes
    sets = [OptionSet("as given", (), given)]
    sharded = bool(args.use_fsdp or args.use_deepspeed)
    base = () if sharded else FSDP2
    if not sharded:
        sets.append(OptionSet("FSDP2 full shard", base, given))
    if not args.use_deepspeed:
        sets.append(OptionSet("+ activation checkpointing", (*base, *CHECKPOINTING), given))
        processes = given * 2
        while processes <= args.fit:
            sets.append(OptionSet(f"+ {processes} processes", (*base, *CHECKPOINTING), processes))
            processes *= 2
        sets.append(OptionSet("+ CPU offload", (*base, *CHECKPOINTING, *OFFLOAD), given))
    if importlib.util.find_spec("deepspeed") is not None and not args.use_fsdp and not (args.use_deepspeed and args.zero_stage == 3):
        sets.append(OptionSet("DeepSpeed ZeRO-3", ZERO3, given))
    return sets


def trial_deadline(args: argparse.Namespace) -> float:
    """Seconds a trial's launch may take: it stops its ranks at its own deadline (``--timeout``, else the dry run's
    default), and this outlasts it by ``LAUNCH_GRACE``."""
    return (getattr(args, "timeout", None) or DEFAULT_TIMEOUT) + LAUNCH_GRACE


def search_deadline(args: argparse.Namespace) -> float:
    """Seconds the whole search for the launch ``args`` may take: a trial's deadline for each option set of its
    ladder, and ``LAUNCH_GRACE`` more for the launch itself."""
    return len(ladder(args)) * trial_deadline(args) + LAUNCH_GRACE


def check(args: argparse.Namespace) -> None:
    """Refuse a ``--fit`` that cannot run (ValueError, one line; see the module docstring)."""
    if args.simulate != "cuda":
        raise ValueError("--fit tries GPU launch options: give --simulate cuda")
    if not (getattr(args, "gpu", None) or getattr(args, "device_memory", None)):
        raise ValueError("--fit needs a budget to fit in: give --gpu (a100-40gb, h100-80gb, ...) or --device-memory")
    if args.fit < args.num_processes:
        raise ValueError(f"--fit {args.fit}: the most processes to try is below the {args.num_processes} given")


def fit(args: argparse.Namespace, argv: list[str]) -> int:
    """Try the ladder for the launch ``args`` (whose command line, after ``launch``, is ``argv``); print the table;
    0 when a set fits, 1 when none does."""
    check(args)
    base = _without_fit(argv, len(args.training_script_args) + 1)
    sets, rows = ladder(args), []
    print(f"Trying {len(sets)} option set(s) until one fits, each a dry run without compute:", flush=True)
    with tempfile.TemporaryDirectory(prefix="fit-") as work:
        for number, option_set in enumerate(sets, 1):
            started = time.monotonic()
            row = _try(args, base, option_set, os.path.join(work, f"{number}.json"))
            rows.append(row)
            print(f"[{number}/{len(sets)}] {option_set.name}: {row['verdict']} ({time.monotonic() - started:.0f} s)", flush=True)
            if row["fits"]:
                break
    fitting = [row for row in rows if row["fits"]]
    print(table([*fitting, *(row for row in rows if not row["fits"])], args))
    if getattr(args, "summary_json", None):
        with open(args.summary_json, "w", encoding="utf-8") as stream:
            json.dump({"rows": rows}, stream, indent=1)
    if not fitting:
        print(f"None of the {len(rows)} option sets tried fits; a larger --fit N tries more processes.")
        return 1
    print(f"Fits with: --num_processes {fitting[0]['processes']} {' '.join(fitting[0]['flags'])}".rstrip())
    return 0


def _without_fit(argv: list[str], tail: int) -> tuple[list[str], list[str]]:
    """``argv`` split into the launch options without ``--fit N`` and the script with its arguments (``tail`` words)."""
    options, script = argv[: len(argv) - tail], argv[len(argv) - tail:]
    kept: list[str] = []
    words = iter(options)
    for word in words:
        if word == "--fit":
            next(words, None)
        elif not word.startswith("--fit="):
            kept.append(word)
    return kept, script


def _try(args: argparse.Namespace, base: tuple[list[str], list[str]], option_set: OptionSet, summary: str) -> dict:
    """Dry-run ``option_set`` (a launch of its own, its output captured, dying with this process: forked from the
    root fork server that the environment names, where there is one) and read its verdict from the summary."""
    options, script = base
    steps = [] if getattr(args, "steps", None) else ["--steps", "2"]
    if option_set.flags[:1] in (("--use_fsdp",), ("--use_deepspeed",)):  # one paradigm at a time
        options = [word for word in options if word not in ("--multi_gpu", "--multi-gpu")]
    launch = [*options, "--no-compute", *steps, *option_set.flags, "--num_processes", str(option_set.processes),
              "--summary-json", summary, *script]
    row = {"name": option_set.name, "flags": list(option_set.flags), "processes": option_set.processes, "fits": False,
           "peak": None, "reserved": None, "headroom": None}
    deadline = trial_deadline(args)
    try:
        done = run_module(CLI_MODULE, *launch, timeout=deadline)
    except subprocess.TimeoutExpired:
        return {**row, "verdict": f"did not run: the launch had not ended after {deadline:g} s"}
    if not os.path.exists(summary):
        error = (done.stderr.strip().splitlines() or ["no summary"])[-1]
        return {**row, "verdict": f"did not run: {error}"}
    with open(summary, encoding="utf-8") as stream:
        ranks = json.load(stream)["ranks"]
    return {**row, **_worst(ranks)}


def _worst(ranks: list[dict]) -> dict:
    """The verdict of a dry run's worst rank: out of memory, failed, may not fit, or the least headroom."""
    for rank in ranks:
        if rank["verdict"] == "out_of_memory":  # the most it held and reserved before it ran out
            books = rank["memory"].values()
            return {"verdict": f"out of memory at step {rank['step']}, {rank['at'] or '?'} (rank {rank['rank']})",
                    "peak": max((device["peak"] for device in books), default=None),
                    "reserved": max((device.get("reserved", device["peak"]) for device in books), default=None)}
    for rank in ranks:
        if rank["state"] != "exit 0":
            return {"verdict": f"failed on rank {rank['rank']}: {rank['state']}"}
    judged = [rank for rank in ranks if rank["verdict"] in ("fits", "may_not_fit")]
    if not judged:
        return {"verdict": "no memory report"}
    worst = min(judged, key=lambda rank: rank["headroom"])
    found = {"peak": max(rank["peak"] for rank in judged), "reserved": max(rank["reserved"] for rank in judged),
             "headroom": worst["headroom"]}
    if any(rank["verdict"] == "may_not_fit" for rank in judged):
        return {**found, "verdict": "may not fit"}
    return {**found, "verdict": "fits", "fits": True}


def table(rows: list[dict], args: argparse.Namespace) -> str:
    """The option sets tried, the one that fits first."""
    from simulators.devices.families.machine import human

    from .estimate import create_ascii_table  # here: estimate's module imports estimate_training, which reads this one

    def size(value: int | None) -> str:
        return human(value) if value is not None else "-"

    budget = f"--gpu {args.gpu}" if getattr(args, "gpu", None) else f"--device-memory {args.device_memory}"
    headers = ["Options", "Processes", "Peak", "Reserved", "Verdict", "Headroom", "Launch options"]
    cells = [[row["name"], str(row["processes"]), size(row["peak"]), size(row["reserved"]), row["verdict"],
              size(row["headroom"]), " ".join(row["flags"]) or "-"] for row in rows]
    return create_ascii_table(headers, cells, f"Fitting {os.path.basename(args.training_script)} in {budget} per process")
