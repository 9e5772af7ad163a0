"""What a dry run needs of the simulator: the environment of a device family, and the run summary.

The dry run itself is a command's (``accelerate-ref launch --simulate
cpu|cuda|xla|npu``, :mod:`accelerate_ref.commands.dry_run`): it runs a user's
unmodified script on the simulator's ranks (``simulators.launcher.launch``: N
ranks as M machines, gloo on loopback) with its launch environment plus
:func:`family_env` (for ``cuda`` / ``xla`` / ``npu``, that family's mock device
first on every rank's import path). Afterwards :func:`summary` lists, per rank, its exit
status; every device-mixing error with the file and line of the user's code
that caused it; every XLA step recompilation with the shapes that changed;
and, for a run stopped at ``--timeout``, the Python stack of every rank
still running. On ``cuda`` a GPU script runs as written for GPUs (HF
accelerate picks ``MULTI_GPU`` over ``nccl``; see :mod:`simulators.devices.families.cuda`
for what the mock takes over from a CPU-only torch).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from collections.abc import Iterator

from simulators.devices.families.machine import human
from simulators.launcher import LaunchResult
from simulators.topology import World

#: Seconds a dry run may take when ``--timeout`` is not given.
DEFAULT_TIMEOUT = 600.0
#: Seconds without a rank exiting after which a dry run reads the ranks' Flight Recorders, so that ranks in
#: different collectives stop it then (``simulators.launcher.launch``'s ``watch``); this variable sets
#: another interval, 0 turns the watch off (``benchmarks/preflight.py`` measures its cost).
WATCH_ENV = "SIMULATORS_WATCH_INTERVAL"
WATCH_INTERVAL_S = 1.0
MIXING = re.compile(r"Expected all tensors to be on the same device[^\n]*")
#: torch's check of the collectives every rank enters (TORCH_DISTRIBUTED_DEBUG=DETAIL, the user's): op, sequence number, shapes.
MISMATCH = re.compile(r"Detected mismatch between collectives on ranks\. Rank (\d+) is running collective: (CollectiveFingerPrint\(.*?\)\)), "
                      r"but Rank (\d+) is running collective: (CollectiveFingerPrint\(.*?\)\))")
FINGERPRINT = re.compile(r"SequenceNumber=(\d+), OpType=(\w+)(?:, TensorShape=(\[[^\]]*\]))?(?:, TensorDtypes=(\w+))?")
#: What a dry run imports before forking its ranks: torch's (always) and, for each library here that the script
#: imports, the modules it imports lazily that a training script reaches anyway. Large imports known to start no
#: thread and touch no device (a fork copies only the importing thread; a library that seeds a global random
#: state at import would give every rank the same one, as numpy's does, so it is not here).
FORK_SAFE = {
    "torch": ("torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor"),
    "transformers": ("transformers", "transformers.modeling_utils"),
    # HF's prepare() imports lomo_optim, where installed, to tell a LOMO optimizer (HF 1.15's accelerator.py,
    # prepare_optimizer), and lomo_optim imports transformers; accelerate_ref's reads it only where it is imported.
    "accelerate": ("accelerate", "lomo_optim"),
    "accelerate_ref": ("accelerate_ref.accelerator",),
    "safetensors": ("safetensors.torch",),
    "peft": ("peft",),
    "trl": ("trl",),
}
#: What each rank of a world of more than one imports when the script imports one of these libraries: DDP's
#: constructor reads torch._dynamo's optimize-DDP mode (torch/nn/parallel/distributed.py) and FSDP2 disables dynamo
#: on its hooks (torch/distributed/fsdp/_fully_shard/_fsdp_common.py); HF accelerate's prepare_data_loader imports
#: datasets, where installed, to tell a datasets IterableDataset (accelerate/data_loader.py), as the Trainers that
#: prepare with it do. About 1.5 s and 1 s of imports in each rank. datasets leaves pyarrow's jemalloc purger
#: running, a thread jemalloc forks safely: its fork handlers (pthread_atfork) hold its locks across the fork, and the
#: child starts the thread again when it allocates.
DISTRIBUTED = {
    "accelerate": ("torch._dynamo", "datasets"),
    "transformers": ("torch._dynamo", "datasets"),
    "trl": ("torch._dynamo", "datasets"),
    "accelerate_ref": ("torch._dynamo",),
    "peft": ("torch._dynamo",),
}
#: DeepSpeed's package, imported once where a rank imports it (a DeepSpeed run, or HF's unwrapping below): about 3 s
#: of imports in each rank. Its import picks its accelerator (deepspeed/accelerator/real_accelerator.py) from the
#: environment every rank has too, and leaves the same jemalloc thread running as datasets (``DISTRIBUTED``).
DEEPSPEED = ("deepspeed",)
#: ... and, where the run trains with DeepSpeed (a DeepSpeed launch, or a script that asks for DeepSpeed), the Muon
#: optimizer module its engine imports when it checks the optimizer (deepspeed/runtime/zero/utils.py:
#: ``is_zero_supported_optimizer``), which imports Inductor's compiler: about 1 s more in each rank. Importing the
#: package does not import it, so a run that only unwraps its model never does.
DEEPSPEED_ENGINE = (*DEEPSPEED, "deepspeed.runtime.zero.muon.muon_optimizer")
#: HF accelerate's ``extract_model_from_parallel`` imports DeepSpeed wherever it is installed, whatever the run
#: (accelerate/utils/other.py: ``from deepspeed import DeepSpeedEngine``), and a rank reaches it when HF's
#: ``prepare`` shards a model (FSDP and tensor parallelism map the optimizer's parameters through
#: ``_get_named_parameters``) and in ``unwrap_model``, ``get_state_dict`` and ``save_model``: about 3.6 s of
#: imports in each rank of a script of one of these libraries ...
WRAPPED_BY_HF = frozenset({"accelerate", "transformers", "trl"})
#: ... that calls one of these (a plugin or configuration that shards the model, or a method that unwraps it) ...
UNWRAPPING_CALLS = frozenset({"FullyShardedDataParallelPlugin", "ParallelismConfig", "unwrap_model", "get_state_dict",
                              "save_model"})
#: ... or passes one of these arguments (the Accelerator's and the Trainer's ways to ask for FSDP or a layout).
SHARDING_ARGUMENTS = frozenset({"fsdp_plugin", "parallelism_config", "fsdp", "fsdp_config"})
#: Libraries whose workspaces the GPU picks at run time, which no source gives a rule for: the smallest ratio of a dry
#: run's reserved peak to a real GPU's among the runs that used one, and why. cuDNN's convolutions: 0.616 (conv) and
#: 0.782 (conv_bf16) of a real H200's (../shared/gpu/summary.json, torch 2.11).
LOWER_BOUNDS = {"cudnn": (0.616, "cuDNN picks its convolution engines and their workspaces on the GPU")}
#: Parts of a peak the summary leaves out when they are 0 (a full fine-tune has no frozen or quantized weights).
OPTIONAL_PARTS = frozenset({"frozen_parameters", "quantized_weights", "communication_buffers", "activations"})
#: The fine-tune and engine packages a script may import, and how to install each (the project's extras).
ENGINE_EXTRAS = {
    "peft": "pip install 'accelerate-ref[finetune]'",
    "bitsandbytes": "pip install --no-deps 'bitsandbytes>=0.45' (extra bnb)",
    "deepspeed": "pip install --no-deps deepspeed hjson msgpack ninja psutil py-cpuinfo pydantic einops (extra deepspeed)",
    "trl": "pip install 'accelerate-ref[finetune]'",
}
#: gloo's words when the rank at the other end of a collective has gone.
PEER_GONE = "Connection closed by peer"
RECOMPILATION = re.compile(r"XLA recompilation at step[^\n]*")
#: A traceback frame: file, line and (when printed) function.
FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in (\w+))?')
TRACEBACK = "Traceback (most recent call last):"


def family_env(family: str) -> dict[str, str]:
    """The environment every rank of a dry run on ``family`` gets from the simulator: one thread, and for a
    mock device family its settings with its sites first on the import path.

    torch's check that every rank enters the same collective with the same shapes
    (``TORCH_DISTRIBUTED_DEBUG=DETAIL``) is not turned on here: on torch 2.13's CPU build it makes DDP's
    construction crash (a segmentation fault in DDP's logger, measured with benchmarks/preflight.py). A
    user who sets it gets its findings named in the summary."""
    from simulators.devices import KINDS, world_settings

    env = {"OMP_NUM_THREADS": "1"}
    if family in KINDS:
        settings = world_settings(family)
        env.update(settings.env)
        env["PYTHONPATH"] = os.pathsep.join([*settings.pythonpath, *filter(None, sys.path)])
    return env


def _parse(script: str) -> ast.Module:
    """``script``'s syntax tree; an empty one for a script that does not parse (its ranks report the error)."""
    try:
        with open(script, encoding="utf-8") as stream:
            return ast.parse(stream.read(), script)
    except (OSError, SyntaxError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def _imports(tree: ast.Module) -> tuple[set[str], list[ast.ImportFrom]]:
    """The top-level packages a script imports, and its absolute ``from ... import`` statements."""
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    froms = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level]
    return imported | {node.module.split(".")[0] for node in froms}, froms


def missing_engines(script: str) -> list[str]:
    """The fine-tune and engine packages ``script`` imports that are not installed, each as the line saying how to
    install it (``ENGINE_EXTRAS``)."""
    imported, _ = _imports(_parse(script))
    return [f"{os.path.basename(script)} imports {package}, which is not installed: {how}"
            for package, how in ENGINE_EXTRAS.items() if package in imported and importlib.util.find_spec(package) is None]


def preload(script: str, ranks: int = 1, deepspeed: bool = False, sharded: bool = False) -> list[str]:
    """The modules a dry run's ranks are forked with, imported once (``simulators.launcher.launch``'s
    ``preload``): torch's, those of the ``FORK_SAFE`` libraries the script imports, and the names it imports from
    them (``"transformers:LlamaForCausalLM"``: the fork server looks the name up, which imports the module a lazy
    package defines it in); at more than one rank, what ``DISTRIBUTED`` wrapping imports; DeepSpeed's where the
    launch is a ``deepspeed`` one or the script asks for it (``DEEPSPEED_ENGINE``), and its package alone
    (``DEEPSPEED``), at more than one rank, where HF unwraps the model (``WRAPPED_BY_HF``): the launch shards it
    (``sharded``: FSDP or a parallelism layout) or the script's calls or arguments do. A module that is not
    installed is left out. A script that does not parse gets torch's only (its ranks report the error)."""
    tree = _parse(script)
    imported, froms = _imports(tree)
    from_safe = [node for node in froms if node.module.split(".")[0] in FORK_SAFE]
    modules = [module for library in ["torch", *sorted(imported & FORK_SAFE.keys() - {"torch"})] for module in FORK_SAFE[library]]
    if ranks > 1:
        modules += [module for library in sorted(imported & DISTRIBUTED.keys()) for module in DISTRIBUTED[library]]
    unwrapped_by_hf = ranks > 1 and not WRAPPED_BY_HF.isdisjoint(imported) and (sharded or _unwraps(tree))
    if imported and (deepspeed or "deepspeed" in imported or _asks_for_deepspeed(tree)):
        modules += DEEPSPEED_ENGINE
    elif unwrapped_by_hf:  # implies a wrapping library among the imports
        modules += DEEPSPEED
    names = [f"{node.module}:{alias.name}" for node in from_safe for alias in node.names if alias.name != "*"]
    return [module for module in dict.fromkeys(modules) if _installed(module)] + names


def _calls(tree: ast.Module) -> Iterator[tuple[str, list[str]]]:
    """Each call in a script: the name called (a function's, or a method's without its object) and the names of
    the keyword arguments it passes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            yield called, [keyword.arg or "" for keyword in node.keywords]


def _asks_for_deepspeed(tree: ast.Module) -> bool:
    """Whether a script makes a ``DeepSpeedPlugin`` or passes a ``deepspeed...=`` argument (the Accelerator's
    ``deepspeed_plugin(s)``, the Trainer's ``deepspeed`` config); importing the plugin's name alone is not asking."""
    return any(called == "DeepSpeedPlugin" or any(keyword.startswith("deepspeed") for keyword in keywords)
               for called, keywords in _calls(tree))


def _unwraps(tree: ast.Module) -> bool:
    """Whether a script calls one of ``UNWRAPPING_CALLS`` (a name or a method) or passes one of
    ``SHARDING_ARGUMENTS``."""
    return any(called in UNWRAPPING_CALLS or not SHARDING_ARGUMENTS.isdisjoint(keywords)
               for called, keywords in _calls(tree))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module.split(".")[0]) is not None


def watch_interval() -> float | None:
    """The Flight Recorder watch's interval for a dry run (None: off); see ``WATCH_ENV``."""
    return float(os.environ.get(WATCH_ENV, WATCH_INTERVAL_S)) or None


def _user_frame(traceback_text: str, script: str, after: str = "") -> str:
    """``file:line`` of the last traceback frame in the user's script (else the last frame outside packages).

    Where the traceback that raised holds no frame of the script (an error raised again while handling it,
    as torch.distributed's logging does, prints the script's frames in the second traceback), the first
    frame of the script in ``after``, the output that follows, is taken."""
    frames = FRAME.findall(traceback_text)
    script = os.path.abspath(script)
    mine = [f for f in frames if os.path.abspath(f[0]) == script]
    if not mine:
        mine = [f for f in FRAME.findall(after) if os.path.abspath(f[0]) == script][:1]
    outside = [f for f in frames if "site-packages" not in f[0] and "/simulators/" not in f[0]]
    chosen = (mine or outside or frames or [("?", "?")])[-1]
    return f"{chosen[0]}:{chosen[1]}"


def _state(result: LaunchResult, rank: int) -> str:
    if rank in result.running:
        return "stopped in a collective mismatch" if result.status == "mismatch" else "still running at the timeout (stopped)"
    if rank in result.exit_codes:
        code = result.exit_codes[rank]
        return "exit 0" if code == 0 else (f"signal {-code}" if code < 0 else f"exit {code}")
    return "stopped after another rank failed"


def _reserved(device: dict) -> int:
    """The most a device reserved (a report without the figure: its peak, a device that caches nothing)."""
    return device.get("reserved", device["peak"])


def _verdict(report: dict | None, budget: int | None, held: int = 0) -> dict:
    """What a rank's memory report says against ``budget`` less what the GPU's runtime ``held`` beside the allocator:
    ``fits`` (with the headroom the highest reserved peak of its devices leaves: what the caching allocator took
    from the card, as on a GPU, where running out is reserving past it), ``may_not_fit`` where the run used a
    library whose workspaces the GPU picks (``LOWER_BOUNDS``) and the headroom is less than such a workspace may
    take, ``out_of_memory`` (where, and torch's message), or ``unknown``."""
    if report is None:
        return {"verdict": "unknown", "reason": "no memory report (no mock device, or stopped before using it)"}
    if report.get("out_of_memory"):
        return {"verdict": "out_of_memory", **report["out_of_memory"]}
    peak = max((device["peak"] for device in report["devices"].values()), default=0)
    reserved = max(map(_reserved, report["devices"].values()), default=0)
    if budget is None:
        return {"verdict": "no_budget", "peak": peak, "reserved": reserved}
    found = {"peak": peak, "reserved": reserved, "headroom": budget - held - reserved}
    for library in report.get("lower_bounds", []):
        ratio, why = LOWER_BOUNDS[library]
        if reserved / ratio > budget - held:
            return {"verdict": "may_not_fit", **found, "reason": f"{why}: a real GPU may reserve up to "
                    f"{human(int(reserved / ratio))}, more than the {human(budget - held)} it has"}
    return {"verdict": "fits", **found}


def _fingerprint(text: str) -> str:
    """``ALLREDUCE #3 [4, 2] Float`` from torch's ``CollectiveFingerPrint(...)``."""
    match = FINGERPRINT.search(text)
    if match is None:
        return text
    sequence, op, shape, dtype = match.groups()
    return " ".join(filter(None, [f"{op} #{sequence}", shape, dtype]))


def _collective_findings(result: LaunchResult, rank: int, tail: str, script: str) -> list[str]:
    """Collectives that cannot complete: ranks in different collectives (or the same with other shapes), as the
    launch's Flight Recorder watch or torch's DETAIL check in the rank's output found them, or a rank left waiting
    in one after others had finished."""
    if result.status == "mismatch" and rank in result.running and result.collectives:
        last = result.collectives.last
        if last.get(rank) is None:
            return []
        where = _user_frame("\n".join(reversed(result.stacks.get(rank, "").splitlines())), script)
        others = [f"rank {other} in {call.describe()}" for other, call in sorted(last.items()) if other != rank and call]
        return [f"collective mismatch at {where}: in {last[rank].describe()}; " + ", ".join(others)]
    mismatch = MISMATCH.search(tail)
    if mismatch:
        mine, theirs = (mismatch.group(1), mismatch.group(2)), (mismatch.group(3), mismatch.group(4))
        return [f"collective mismatch at {_user_frame(tail[: mismatch.end()], script, tail[mismatch.end():])}: rank {mine[0]} in "
                f"{_fingerprint(mine[1])}, rank {theirs[0]} in {_fingerprint(theirs[1])}"]
    finished = [other for other, code in sorted(result.exit_codes.items()) if code == 0 and other != rank]
    if PEER_GONE in tail and finished:
        calls = [c for c in FRAME.findall(tail[: tail.index(PEER_GONE)]) if "torch/distributed" in c[0] and c[2] not in ("", "wrapper")]
        where = f"{calls[-1][2]} at " if calls else ""
        return [f"waited alone in {where}{_user_frame(tail[: tail.index(PEER_GONE)], script)} after rank(s) "
                f"{', '.join(map(str, finished))} had finished: a collective not every rank calls"]
    return []


def _raised(tail: str, script: str) -> dict | None:
    """The exception a rank's output ends with: the line of the user's script it came through and torch's,
    accelerate's or the script's own words (``ValueError: ParallelismConfig total_size (4) does not match
    num_processes (8). ...``); None when the output holds no traceback. Of chained tracebacks, the last."""
    start = tail.rfind(TRACEBACK)
    if start < 0:
        return None
    lines = tail[start:].splitlines()[1:]
    body = [line for line in lines if line.startswith((" ", "\t"))]
    error = next((line for line in lines if line and not line.startswith((" ", "\t"))), "")
    if not error:
        return None
    return {"at": _user_frame("\n".join(body), script), "error": error.strip()}


def record(result: LaunchResult, world: World, script: str, budget: int | None = None,
           held: dict[str, int] | None = None) -> dict:
    """The dry run's findings, machine-readable (``--summary-json``): per rank its exit state, device
    mixing, XLA recompilations, memory (peak and reserved peak per device, when and where, what it held, the
    verdict against the budget by the reserved peak) and, without computing, where the script got placeholders
    for values. ``held``: what the GPU's runtime holds beside the allocator in each rank, by what it is."""
    ranks = []
    for rank in range(world.size):
        tail = result.output_tail.get(rank, "")
        report = result.memory.get(rank)
        ranks.append({
            "rank": rank,
            "state": _state(result, rank),
            "device_mixing": [{"at": _user_frame(tail[: m.end()], script), "message": m.group(0)} for m in MIXING.finditer(tail)],
            "recompilations": [m.group(0) for m in RECOMPILATION.finditer(tail)],
            "collectives": _collective_findings(result, rank, tail, script),
            "raised": _raised(tail, script) if result.exit_codes.get(rank, 0) > 0 else None,
            "memory": report["devices"] if report else {},
            "steps": report["steps"] if report else None,
            "placeholders": report.get("placeholders", []) if report else [],  # no-compute runs: values not computed
            "batches": report.get("batches") if report else None,
            "lower_bounds": report.get("lower_bounds", []) if report else [],
            **_verdict(report, budget, sum((held or {}).values())),
        })
    return {"world": {"ranks": world.size, "machines": world.machines}, "status": result.status,
            "budget": budget, "held": held or {}, "ranks": ranks}


def _memory_line(rank: dict) -> str | None:
    """One rank's memory, as the summary prints it (None when the rank reported none)."""
    if rank["verdict"] == "out_of_memory":
        return f"rank {rank['rank']}: out of memory on {rank['device']} at step {rank['step']}, {rank['at'] or '?'}: {rank['message']}"
    if rank["verdict"] == "unknown" or not rank["memory"]:
        return None
    device, peak = max(rank["memory"].items(), key=lambda item: (_reserved(item[1]), item[1]["peak"]))
    parts = ", ".join(f"{name.replace('_', ' ')} {human(size)}" for name, size in peak["parts"].items()
                      if size or name not in OPTIONAL_PARTS)
    verdict = {"fits": lambda: f"fits, {human(rank['headroom'])} headroom",
               "may_not_fit": lambda: f"may not fit: {rank['reason']}",
               "no_budget": lambda: "no budget given (--device-memory or --gpu)"}[rank["verdict"]]()
    when = f"at step {peak['step']}" if peak["step"] else "before any optimizer step"
    bounds = "".join(f"; a lower bound: {LOWER_BOUNDS[library][1]}" for library in rank["lower_bounds"])
    return (f"rank {rank['rank']}: peak {human(peak['peak'])}, reserved {human(_reserved(peak))} on {device} {when}, "
            f"{peak['at'] or '?'} ({parts}): {verdict}{bounds}")


def _raised_lines(ranks: list[dict]) -> list[str]:
    """Each exception the ranks raised, once, with the ranks that raised it: the run's finding in one line
    (a misconfigured layout raises the same on every rank)."""
    raised: dict[tuple[str, str], list[int]] = {}
    for rank in ranks:
        if rank["raised"]:
            raised.setdefault((rank["raised"]["at"], rank["raised"]["error"]), []).append(rank["rank"])
    return [f"{_who(on, ranks)} raised at {at}: {error}" for (at, error), on in raised.items()]


def _who(on: list[int], ranks: list[dict]) -> str:
    """``every rank`` when ``on`` holds all of ``ranks``, else ``rank(s) 0, 2``."""
    return "every rank" if len(on) == len(ranks) else f"rank(s) {', '.join(map(str, on))}"


def _placeholder_lines(ranks: list[dict]) -> list[str]:
    """Each line of the script that read a value no-compute mode did not compute, once: what it asked for and on
    which ranks (their results there are placeholders, zeros)."""
    places: dict[tuple[str, str], list[int]] = {}
    for rank in ranks:
        for place in rank["placeholders"]:
            places.setdefault((place["at"] or "?", place["what"]), []).append(rank["rank"])
    if not places:
        return []
    lines = ["-- values not computed (--no-compute: these read zeros) --"]
    for (at, what), on in sorted(places.items()):
        lines.append(f"{at}: {what} on {_who(on, ranks)}")
    return lines


def _batch_lines(ranks: list[dict]) -> list[str]:
    """Which batches ran first where the heaviest were asked for (``--heaviest-batches``), else a warning when the
    batches that ran differed in size: the peak may come at a larger one the run did not reach."""
    lines = []
    for rank in ranks:
        batches = rank.get("batches") or {}
        ran = batches.get("ran", [])
        sizes = {batch["size"] for batch in ran}
        if batches.get("heaviest") and ran:
            read = sum(batches.get("read", [])) or len(ran)
            first = ", ".join(f"#{batch['index']} ({batch['size']:,} elements)" for batch in ran[1:batches["heaviest"] + 1])
            lines.append(f"rank {rank['rank']}: of {read} batches read, ran the first, then the heaviest: {first}")
        elif len(sizes) > 1:
            lines.append(f"rank {rank['rank']}: the {len(ran)} batches it ran differ in size ({min(sizes):,} to "
                         f"{max(sizes):,} elements): a larger batch later in the data may peak higher; "
                         "--heaviest-batches K runs the largest first")
    return ["-- batches --", *lines] if lines else []


def _budget_words(budget: int, name: str, held: dict[str, int]) -> str:
    """``budget 39.39 GiB per device, a100-40gb as torch reports it, less CUDA context 426.00 MiB ...``."""
    words = f"budget {human(budget)} per device"
    if name:
        words += f", {name} as torch reports it"
    if held:
        words += ", less " + " and ".join(f"{what} {human(size)}" for what, size in held.items()) + " per process"
    return words


def summary(result: LaunchResult, world: World, script: str, budget: int | None = None, budget_name: str = "",
            held: dict[str, int] | None = None) -> str:
    """The run summary printed after a dry run (see :func:`record` for what it reports)."""
    found = record(result, world, script, budget, held)
    lines = [f"== dry run summary: {world.size} ranks as {world.machines} machine(s), {result.status} =="]
    lines += [f"rank {rank['rank']}: {rank['state']}" for rank in found["ranks"]]
    lines += _raised_lines(found["ranks"])
    for rank in found["ranks"]:
        lines += [f"rank {rank['rank']}: device mixing at {m['at']}: {m['message']}" for m in rank["device_mixing"]]
        lines += [f"rank {rank['rank']}: {text}" for text in rank["recompilations"] + rank["collectives"]]
    memory = [line for line in map(_memory_line, found["ranks"]) if line]
    if memory:
        of = _budget_words(budget, budget_name, held or {}) if budget else "no budget"
        lines += [f"-- memory per rank ({of}) --", *memory]
    lines += _batch_lines(found["ranks"])
    lines += _placeholder_lines(found["ranks"])
    for rank, stack in sorted(result.stacks.items()):
        lines.append(f"--- rank {rank} stack ---\n{stack.rstrip()}")
    return "\n".join(lines)
