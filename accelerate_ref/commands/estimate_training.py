"""``accelerate-ref estimate-memory MODEL --training``: what each GPU holds at the peak of training MODEL on N GPUs.

This module's addition to HF 1.15's command (whose table counts the weights and
Adam's states of one unsharded copy: no activations, no world size, no
sharding). Rule: the model is built empty from its config (a local model
folder or ``config.json``, offline: ``transformers``' ``AutoConfig`` and
``AutoModelForCausalLM.from_config``), then a script trains it for two steps
(the second is the steady state: the first's backward runs before the
optimizer has state) with accelerate_ref's ``Accelerator`` on
``--num_processes`` mock GPUs as ``--num_machines`` machines, dry-run in
no-compute mode (``accelerate-ref launch --simulate cuda --no-compute``: shapes,
dtypes and collectives, no values), with batches of ``--batch_size`` sequences
of ``--seq_len`` random tokens. ``--distributed``: ``ddp`` (every rank holds the
model), ``fsdp`` (FSDP2 full shard, each decoder layer then the root), ``zero2``
and ``zero3`` (DeepSpeed, the ``deepspeed`` extra; ZeRO-3 builds the model partitioned, under
``deepspeed.zero.Init``), each given to the launch as ``accelerate launch``'s options (`LAUNCH_OPTIONS`). With
``--fit N`` the launch tries the options that make a run fit instead (:mod:`.fit`). The table gives per rank
the peak, the peak of what torch's caching allocator reserved (its model's, see
``simulators.devices.memory.caching_allocator``), the peak's parts (parameters: the
model's, trainable, frozen and quantized together; gradients; optimizer state;
DeepSpeed's communication buffers; activations, what autograd holds for backward; the rest: temporaries) and where it was reached; ranks with the same figures share
a row. With ``--gpu`` (or ``--device-memory``) each row ends with the verdict of the
reserved peak against that budget.

Refusals, one line each before anything runs (ValueError, exit 2): a model
that is not a local folder or config file, a folder without ``config.json``,
``--distributed zero2`` or ``zero3`` without ``deepspeed``, a world that does not
divide into the machines.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap

from simulators.fork_root import run_module, start_module

from ..utils import convert_bytes
from ._launch.options import FIT_HELP
from .fit import CLI_MODULE, FSDP2, LAUNCH_GRACE, ZERO3, search_deadline

DISTRIBUTED = ("ddp", "fsdp", "zero2", "zero3")
MIXED_PRECISION = ("no", "fp16", "bf16")

#: The training script each rank runs; ``sys.argv``: model folder, distributed, batch size, sequence length and,
#: optionally, the optimizer steps (two by default: the second runs with the optimizer state the first made).
SCRIPT = textwrap.dedent("""\
    import contextlib
    import sys

    import torch
    import transformers
    from torch.distributed.fsdp import CPUOffloadPolicy

    from accelerate_ref import Accelerator
    from accelerate_ref.big_modeling import init_empty_weights
    from accelerate_ref.utils import DistributedType

    folder, batch, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    accelerator = Accelerator()  # FSDP or DeepSpeed as the launch's options set them
    if accelerator.distributed_type == DistributedType.DEEPSPEED:  # its batch size is read from its config (no data loader here)
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = batch
    config = transformers.AutoConfig.from_pretrained(folder)
    zero3 = accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3
    with contextlib.nullcontext() if zero3 else init_empty_weights(include_buffers=False):  # ZeRO-3 partitions as it builds
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if accelerator.distributed_type == DistributedType.FSDP:  # sharded on the meta device: only each rank's shards take memory
        model = accelerator.prepare(model, device_placement=[False])
        offloaded = isinstance(accelerator.state.fsdp_plugin.cpu_offload, CPUOffloadPolicy)  # the shards live on the CPU
        model.to_empty(device="cpu" if offloaded else accelerator.device)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))
    else:  # DeepSpeed takes the model and its optimizer in one call
        model = model if zero3 else model.to_empty(device=accelerator.device)
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True))
    for step in range(steps):
        tokens = torch.randint(0, config.vocab_size, (batch, length), device=accelerator.device)
        loss = model(input_ids=tokens, labels=tokens).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    """)
#: ``--distributed`` -> the launch options that give it (``accelerate launch``'s).
LAUNCH_OPTIONS = {"ddp": (), "fsdp": FSDP2, "zero2": ("--use_deepspeed", "--zero_stage", "2"), "zero3": ZERO3}


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--training`` flags of ``estimate-memory``."""
    group = parser.add_argument_group("training estimate (dry-run on mock GPUs, no compute)")
    group.add_argument("--training", action="store_true", help="estimate each GPU's peak while training the model")
    group.add_argument("--num_processes", type=int, default=1, help="GPUs in all (default 1)")
    group.add_argument("--num_machines", type=int, default=1, help="machines they are spread over (default 1)")
    group.add_argument("--distributed", default="ddp", help=f"how the model is spread: {', '.join(DISTRIBUTED)} (default ddp)")
    group.add_argument("--mixed_precision", default="no", help=f"{', '.join(MIXED_PRECISION)} (default no)")
    group.add_argument("--batch_size", type=int, default=1, help="sequences per GPU per step (default 1)")
    group.add_argument("--seq_len", type=int, default=512, help="tokens per sequence (default 512)")
    group.add_argument("--gpu", default=None, help="judge each rank against this GPU's memory (a100-40gb, h100-80gb, ...)")
    group.add_argument("--device-memory", dest="device_memory", default=None, help="or against this budget (40GiB, ...)")
    group.add_argument("--timeout", type=float, default=600, help="seconds before the dry run is stopped (default 600)")
    group.add_argument("--fit", type=int, default=None, metavar="N", help=FIT_HELP)


def check(args: argparse.Namespace) -> None:
    """Refuse what cannot run, one line each (ValueError; see the module docstring)."""
    if args.distributed not in DISTRIBUTED:
        raise ValueError(f"--distributed {args.distributed!r} is not one of {', '.join(DISTRIBUTED)}")
    if args.mixed_precision not in MIXED_PRECISION:
        raise ValueError(f"--mixed_precision {args.mixed_precision!r} is not one of {', '.join(MIXED_PRECISION)}")
    folder = args.model_name if os.path.isdir(args.model_name) else os.path.dirname(args.model_name) or "."
    if not os.path.exists(args.model_name):
        raise ValueError(f"--training reads a local model folder or config.json, offline; {args.model_name!r} is neither")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ValueError(f"{args.model_name!r} has no config.json: --training builds the model from its config")
    if args.distributed.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        raise ValueError(f"--distributed {args.distributed} needs deepspeed (pip install accelerate-ref[deepspeed])")
    if min(args.num_processes, args.num_machines, args.batch_size, args.seq_len) < 1:
        raise ValueError("--num_processes, --num_machines, --batch_size and --seq_len must be at least 1")
    if args.num_processes % args.num_machines:
        raise ValueError(f"--num_processes {args.num_processes} does not divide into {args.num_machines} machines")


def launch_arguments(args: argparse.Namespace, script: str, summary: str | None = None) -> list[str]:
    """The arguments of the ``accelerate-ref launch`` that dry-runs ``script`` as ``args`` ask (no compute)."""
    budget = ["--gpu", args.gpu] if args.gpu else ["--device-memory", args.device_memory] if args.device_memory else []
    folder = args.model_name if os.path.isdir(args.model_name) else os.path.dirname(args.model_name) or "."
    fit = ["--fit", str(args.fit)] if getattr(args, "fit", None) is not None else []
    return ["launch", "--simulate", "cuda", "--no-compute",
            "--num_processes", str(args.num_processes), "--num_machines", str(args.num_machines),
            "--mixed_precision", args.mixed_precision, "--timeout", str(args.timeout), *LAUNCH_OPTIONS[args.distributed],
            *(["--summary-json", summary] if summary else []), *budget, *fit,
            script, os.path.abspath(folder), str(args.batch_size), str(args.seq_len)]


def estimate_training(args: argparse.Namespace) -> int:
    """Dry-run the training script (see the module docstring) and print the per-rank table, or with ``--fit`` the
    launch's table of option sets (:mod:`.fit`); the exit status."""
    check(args)
    with tempfile.TemporaryDirectory(prefix="estimate-training-") as work:
        script, summary = os.path.join(work, "train.py"), os.path.join(work, "summary.json")
        with open(script, "w", encoding="utf-8") as stream:
            stream.write(SCRIPT)
        if getattr(args, "fit", None) is not None:  # the launch prints its progress and table as it goes
            return _fit_search(args, script)
        print(f"Dry-running two training steps of `{args.model_name}` on {args.num_processes} mock GPU(s) "
              f"({args.distributed}, mixed precision {args.mixed_precision}), no compute...", flush=True)
        try:
            done = run_module(CLI_MODULE, *launch_arguments(args, script, summary), timeout=args.timeout + LAUNCH_GRACE)
        except subprocess.TimeoutExpired as expired:
            print(f"estimate-memory: the dry run had not ended {expired.timeout:g} s after it started; stopped",
                  file=sys.stderr)
            return 1
        if not os.path.exists(summary):
            print(done.stdout[-4000:] + done.stderr[-2000:], file=sys.stderr)
            return done.returncode or 1
        with open(summary, encoding="utf-8") as stream:
            found = json.load(stream)
    print(table(found, args))
    if done.returncode:  # the ranks' errors (the launcher's report) and the dry run's summary
        print(done.stderr[-4000:] + done.stdout[-4000:], file=sys.stderr)
    return done.returncode


def fit_deadline(args: argparse.Namespace) -> float:
    """Seconds ``--fit``'s launch may run before it is stopped: the search's own deadline
    (:func:`.fit.search_deadline`) for the launch these ``args`` make."""
    from .launch import launch_command_parser

    return search_deadline(launch_command_parser().parse_args(launch_arguments(args, "train.py")[1:]))


def _fit_search(args: argparse.Namespace, script: str) -> int:
    """Run ``--fit``'s launch of ``script`` on this process's streams; its exit status, or 1 with one line when it
    outlasts :func:`fit_deadline` (it is stopped, and its trials with it)."""
    deadline = fit_deadline(args)
    search = start_module(CLI_MODULE, launch_arguments(args, script), os.environ, stdin=0, stdout=1, stderr=2,
                          new_session=False)
    try:
        return search.wait(deadline)
    except subprocess.TimeoutExpired:
        search.kill()
        search.wait(LAUNCH_GRACE)
        print(f"estimate-memory: the fit search had not ended {deadline:g} s after it started; stopped", file=sys.stderr)
        return 1


def rows(found: dict) -> list[list[str]]:
    """One row per group of ranks with the same peak and parts: ranks, peak, reserved peak, the parts, where, the
    verdict (by the reserved peak: what the caching allocator took from the card)."""
    from simulators.devices.memory.peaks import PARAMETER_PARTS

    grouped: dict[tuple, list[int]] = {}
    for rank in found["ranks"]:
        if not rank["memory"]:
            key = ("-", "-", "-", "-", "-", "-", "-", "-", rank["state"], rank.get("reason", rank["verdict"]))
        else:
            device = max(rank["memory"].values(), key=lambda books: (books.get("reserved", books["peak"]), books["peak"]))
            parts = device["parts"]
            verdict = {"fits": lambda: f"fits ({convert_bytes(rank['headroom'])} free)", "no_budget": lambda: "-",
                       "may_not_fit": lambda: f"may not fit ({rank['reason']})",
                       "out_of_memory": lambda: f"out of memory at {rank.get('at') or '?'}"}[rank["verdict"]]()
            if rank["verdict"] != "out_of_memory" and rank["state"] != "exit 0":
                verdict = f"failed: {rank['state']} (see below)"
            key = (convert_bytes(device["peak"]), convert_bytes(device.get("reserved", device["peak"])),
                   convert_bytes(sum(parts[kind] for kind in PARAMETER_PARTS)), convert_bytes(parts["gradients"]),
                   convert_bytes(parts["optimizer_state"]), convert_bytes(parts.get("communication_buffers", 0)),
                   convert_bytes(parts.get("activations", 0)), convert_bytes(parts["other"]),
                   f"step {device['step']}, {device['at'] or '?'}", verdict)
        grouped.setdefault(key, []).append(rank["rank"])
    return [[_ranks(ranks), *key] for key, ranks in grouped.items()]


def _ranks(ranks: list[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else ",".join(map(str, ranks))


def table(found: dict, args: argparse.Namespace) -> str:
    """The per-rank table of a dry run's summary (``--summary-json``) for ``args``."""
    from .estimate import create_ascii_table

    headers = ["Ranks", "Peak", "Reserved", "Parameters", "Gradients", "Optimizer state", "Buffers", "Activations", "Other", "Reached at",
               "Verdict"]
    title = (f"Training `{args.model_name}`: {args.num_processes} GPU(s) on {args.num_machines} machine(s), {args.distributed}, "
             f"mixed precision {args.mixed_precision}, batch {args.batch_size} x {args.seq_len} tokens per GPU")
    return create_ascii_table(headers, rows(found), title)
