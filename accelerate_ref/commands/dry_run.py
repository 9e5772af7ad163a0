"""``accelerate-ref launch --simulate cpu|cuda|xla|npu``: a dry run of a user's unmodified script on simulated ranks.

Rule: the script runs on ``num_processes`` simulator ranks as
``num_machines`` machines with the environment ``launch`` would give it (HF
accelerate's launch variables; ``ACCELERATE_USE_CPU`` for ``cpu``) plus the
simulator's for the family (:func:`simulators.dryrun.family_env`) and each
mock device's memory budget (``--device-memory``, or a ``--gpu`` preset: the card's memory as torch reports
it, of which the CUDA context and NCCL's buffers take their share, :mod:`simulators.devices.families.gpus`) and,
with ``--no-compute``, tensors without values, with ``--steps N``, ranks that end after
N optimizer steps (:mod:`simulators.devices.families.machine`), with ``--heaviest-batches K``, each
data loader's K largest batches first (:mod:`simulators.devices.memory.batches`); then
the simulator's run summary is printed (with each rank's peak device memory
and its verdict against the budget; as JSON too with ``--summary-json``; as one
self-contained HTML page with ``--report PATH.html``, :mod:`simulators.report`: each
rank's memory over the run, what it held at its peak, the findings and the verdict;
with ``--memory-snapshot DIR`` on ``cuda``, each rank's allocation history as
``DIR/rank<N>.pickle`` in the format of ``torch.cuda.memory._snapshot()``) and
the launch's exit status returned. Ranks that enter different collectives
stop the run within about a second (the simulator's Flight Recorder watch),
each rank's collective and line named. A budget that does not parse, an unknown
preset, a budget without a mock device family, a script importing an engine
that is not installed (peft, bitsandbytes, deepspeed, trl: the line says how to
install it), a setup the family's
hardware does not run (FSDP or fp16 on XLA), a ``--report`` or ``--memory-snapshot``
path that cannot be written (or ``--report`` without plotly, ``--memory-snapshot``
on a family without the caching allocator) is a ValueError (one line, exit
2) before any rank starts.
The simulator knows no implementation: it takes argv, world, environment and
timeout.
"""

from __future__ import annotations

import argparse
import json
import os

from ..utils.launch import launch_env


def _budget(args: argparse.Namespace) -> tuple[str | None, str]:
    """The per-device budget the flags ask for (checked by ``machine_env``) and the preset's name."""
    from simulators.devices.families.machine import gpu_budget

    memory, name = getattr(args, "device_memory", None), ""
    if getattr(args, "gpu", None):
        if memory:
            raise ValueError("--gpu and --device-memory both set a budget: give one")
        memory, name = gpu_budget(args.gpu), args.gpu.lower()
    return memory, name


def _check_mock_device_flags(args: argparse.Namespace, memory: str | None) -> None:
    """Refuse what only a mock device family has (a budget, no-compute mode, a step limit, the heaviest batches first)
    on ``--simulate cpu``, and a step or batch count below 1 (ValueError, one line)."""
    asked = (("a memory budget", memory is not None), ("--no-compute", getattr(args, "no_compute", False)),
             ("--steps", getattr(args, "steps", None) is not None),
             ("--heaviest-batches", getattr(args, "heaviest_batches", None) is not None))
    for what, given in asked:
        if given and args.simulate == "cpu":
            raise ValueError(f"{what} needs a mock device: --simulate cuda, xla or npu (not cpu)")
    for flag, count in (("--steps", getattr(args, "steps", None)), ("--heaviest-batches", getattr(args, "heaviest_batches", None))):
        if count is not None and count < 1:
            raise ValueError(f"{flag} {count}: give at least 1")


#: (family, launch option, value) a family's hardware does not run, with why (refused before any rank starts).
UNSUPPORTED = {
    ("xla", "use_fsdp", True): "torch's FSDP does not run on XLA devices (TPUs shard with torch_xla's own FSDP): "
                               "dry-run FSDP with --simulate cuda or npu",
    ("xla", "mixed_precision", "fp16"): "fp16 mixed precision is not a TPU setup (HF accelerate refuses it on XLA): use bf16",
}


def _check_family_runs(args: argparse.Namespace) -> None:
    """Refuse a setup the simulated family's hardware cannot run (ValueError, one line)."""
    for (family, option, value), why in UNSUPPORTED.items():
        if args.simulate == family and getattr(args, option, None) == value:
            raise ValueError(f"--simulate {family}: {why}")


def _output_paths(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The absolute ``--report`` file and ``--memory-snapshot`` folder, their folders made; ValueError (one line) for
    a path that cannot be written, ``--report`` without plotly, or ``--memory-snapshot`` off ``--simulate cuda``."""
    report, folder = getattr(args, "report", None), getattr(args, "memory_snapshot", None)
    if report:
        from simulators.report import missing_library

        report = os.path.abspath(report)
        if os.path.isdir(report):
            raise ValueError(f"--report {args.report}: a folder; give the HTML file to write")
        _writable_folder("--report", args.report, os.path.dirname(report))
        missing = missing_library()
        if missing:
            raise ValueError(f"--report: {missing}")
    if folder:
        if args.simulate != "cuda":
            raise ValueError(f"--memory-snapshot records the CUDA caching allocator's history: give --simulate cuda (not {args.simulate})")
        folder = os.path.abspath(folder)
        _writable_folder("--memory-snapshot", args.memory_snapshot, folder)
    return report, folder


def _writable_folder(flag: str, given: str, folder: str) -> None:
    """Make ``folder`` (for ``flag``'s value ``given``); ValueError when it cannot be made or written in."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{flag} {given}: cannot make the folder {folder}: {error.strerror or error}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {given}: cannot write in {folder}")


def dry_run(args: argparse.Namespace) -> int:
    """Run ``args.training_script`` on the simulator and print the summary; return the launcher's exit status."""
    from simulators.devices.memory.batches import HEAVIEST_ENV
    from simulators.devices.memory.peaks import SNAPSHOT_ENV
    from simulators.devices.families.gpus import runtime_held
    from simulators.devices.families.machine import NO_COMPUTE_ENV, STEPS_ENV, gpu_env, machine_env, parse_size
    from simulators.dryrun import DEFAULT_TIMEOUT, family_env, missing_engines, preload, record, summary, watch_interval
    from simulators.launcher import launch
    from simulators.topology import World

    if args.module or args.no_python:
        raise ValueError("--simulate runs a script file; -m and --no_python are not supported with it")
    _check_family_runs(args)
    missing = missing_engines(args.training_script)
    if missing:
        raise ValueError(missing[0])
    memory, preset = _budget(args)
    _check_mock_device_flags(args, memory)
    report, snapshots = _output_paths(args)
    world = World.of(args.num_processes, machines=args.num_machines)
    env = {**launch_env(args, base={}), "ACCELERATE_USE_CPU": str(args.simulate == "cpu" or bool(args.cpu)),
           **family_env(args.simulate), **machine_env(args.simulate, memory=memory), **(gpu_env(preset, world.size) if preset else {}),
           **({NO_COMPUTE_ENV: "1"} if getattr(args, "no_compute", False) else {}),
           **({STEPS_ENV: str(args.steps)} if getattr(args, "steps", None) else {}),
           **({HEAVIEST_ENV: str(args.heaviest_batches)} if getattr(args, "heaviest_batches", None) else {}),
           **({SNAPSHOT_ENV: snapshots} if snapshots else {})}
    result = launch([args.training_script, *args.training_script_args], world,
                    timeout=args.timeout or DEFAULT_TIMEOUT, env=env, watch=watch_interval(),
                    preload=preload(args.training_script, world.size, deepspeed=bool(args.use_deepspeed),
                                    sharded=args.use_fsdp or args.use_parallelism_config))
    budget, held = parse_size(memory) if memory else None, runtime_held(world.size) if preset else {}
    text = summary(result, world, args.training_script, budget, preset, held)
    print(text, flush=True)
    found = record(result, world, args.training_script, budget, held) if getattr(args, "summary_json", None) or report else None
    if getattr(args, "summary_json", None):
        with open(args.summary_json, "w", encoding="utf-8") as stream:
            json.dump(found, stream, indent=1)
    if report:
        from simulators.report import write_report

        write_report(report, found, result.memory, text, args.training_script)
        print(f"report: {report}", flush=True)
    if snapshots:
        print(f"memory snapshots: {snapshots}/rank<N>.pickle (python -m torch.cuda._memory_viz trace_plot "
              f"{snapshots}/rank0.pickle -o trace.html)", flush=True)
    return result.exit_code
