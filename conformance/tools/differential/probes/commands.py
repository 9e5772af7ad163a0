"""Probes of ``accelerate.commands``: what a user who types ``accelerate-ref`` where they typed ``accelerate`` meets
first. The launch parser (its groups, options in both spellings, defaults; what a command line parses to; the
exit status of a bad one), ``launch -h`` through the console script (the options each section lists, hyphen
spellings that leak into it), ``_validate_launch_command`` on the implementation's own namespace (the defaults it
fills, the config it reads, its refusals and warning), config files that are missing, unknown-keyed or empty (and
``config update`` / ``config default`` around them), and ``to-fsdp2``'s refusals and warnings.

No probe launches a process. The default config file is pointed at the probe's folder for both implementations:
HF fixes its path when ``accelerate.commands.config.config_args`` is imported, accelerate-ref applies the location
rule when a command runs, so the probe sets the module constants and ``HF_HOME`` alike.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock

import yaml

from ..probe import Api, probe

AREA = "commands"
LAUNCH = "commands.launch"
#: Modules holding a ``default_config_file`` constant that a command reads the default config's path from.
DEFAULT_PATH_HOLDERS = ("commands.config.config_args", "commands.config.update", LAUNCH)
#: A valid config (one process, no accelerator) and a multi-GPU one.
LOCAL = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no", "use_cpu": False,
         "debug": False, "num_processes": 1}
MULTI_GPU = {**LOCAL, "distributed_type": "MULTI_GPU", "mixed_precision": "fp16", "num_processes": 2, "gpu_ids": "0,1"}
#: HF's ``tests/test_configs/validate_launch_cmd.yaml``: a section key and a DeepSpeed key that a flag overrides.
VALIDATE = {**LOCAL, "debug": True, "fsdp_config": {"fsdp_sync_module_states": False},
            "deepspeed_config": {"deepspeed_config_file": "path/to/be/ignored"}}
FSDP1 = {**LOCAL, "distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP",
                                                               "fsdp_sync_module_states": True, "fsdp_offload_params": False}}
_SECTION = re.compile(r"^(\S.*):$")
_OPTION_ITEM = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)")


def _write(path: Path, values: Any) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values) if path.suffix == ".json" else yaml.safe_dump(values))
    return str(path)


@contextlib.contextmanager
def _default_config_at(api: Api, path: Path) -> Iterator[None]:
    """The default config file read from ``path`` by either implementation (module constants and ``HF_HOME``)."""
    saved = []
    for holder in DEFAULT_PATH_HOLDERS:
        module = api.get(holder)
        if hasattr(module, "default_config_file"):
            saved.append((module, module.default_config_file))
            module.default_config_file = str(path)
    os.environ["HF_HOME"] = str(path.parent.parent)
    try:
        yield
    finally:
        for module, value in saved:
            module.default_config_file = value


def _groups(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Each argument group's options: ``"<dest> <first option>"`` -> option strings, default, choices, nargs, const."""
    return {group.title: {f"{action.dest} {action.option_strings[0] if action.option_strings else ''}".strip():
                          {"options": sorted(action.option_strings), "default": action.default, "choices": action.choices,
                           "nargs": action.nargs, "const": action.const, "required": action.required}
                          for action in group._group_actions}
            for group in parser._action_groups}


@probe(AREA)
def launch_parser_options(api: Api) -> None:
    """Every group of ``launch_command_parser()`` with its options, both spellings and defaults; built as a
    subcommand of ``CustomArgumentParser`` (as the console script builds it) it has the same groups."""
    make = api.get(f"{LAUNCH}.launch_command_parser")
    standalone = _groups(make())
    for title, options in standalone.items():
        api.record(f"group {title}", options)
    parent = api.get("commands.utils.CustomArgumentParser")(allow_abbrev=False)
    api.observe("as a subcommand of CustomArgumentParser: the same groups",
                lambda: _groups(make(parent.add_subparsers())) == standalone)


#: Command lines written for ``accelerate launch`` (HF's ``test_hyphen`` / ``test_underscore`` and more).
SPELLINGS = {
    "hyphens": ["--config-file", "test.yaml", "--multi-gpu", "--num-processes", "4", "test.py"],
    "underscores": ["--config_file", "test.yaml", "--multi_gpu", "--num_processes", "4", "test.py"],
    "mixed": ["--multi-gpu", "--use_deepspeed", "--use-fsdp", "--num_processes", "4", "test.py", "--lr", "1"],
    "ports and torchrun options": ["--main-process-port", "29501", "--main_process_ip", "10.0.0.1", "--max-restarts",
                                   "2", "--monitor_interval", "0.5", "-t", "3", "--rdzv-conf", "a=1", "--no-python", "x"],
    "section options": ["--fsdp-sync-module-states", "false", "--fsdp_version", "2", "--tpu-cluster", "--no-tpu-cluster",
                        "--fp8-override-linear-precision", "true,false,true", "--zero-stage", "3", "-m", "pkg.train"],
}
#: Destinations whose values are recorded for every command line, given or not (defaults included).
WATCHED = ("config_file", "multi_gpu", "use_deepspeed", "use_fsdp", "num_processes", "debug", "module", "no_python",
           "quiet", "fsdp_sync_module_states", "fsdp_version", "tpu_use_cluster", "training_script", "training_script_args")
#: Command lines a launch parser refuses (argparse's exit status 2).
REFUSED = {
    "an abbreviated option": ["--num_proc", "2", "test.py"],
    "a value of the wrong type": ["--num-processes", "two", "test.py"],
    "a choice not offered": ["--mixed-precision", "fp9", "test.py"],
    "no script": [],
}


def _exit_status(parse: Callable[[list[str]], Any], argv: list[str]) -> Any:
    """argparse's exit status for ``argv`` (its usage text, which names the program, is left out)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            parse(argv)
        except SystemExit as stopped:
            return stopped.code
    return "parsed"


@probe(AREA)
def launch_parser_spellings(api: Api) -> None:
    """What command lines in either spelling parse to: the flags given (``nondefault``) with their values, and the
    watched destinations; then the exit status of refused ones."""
    make = api.get(f"{LAUNCH}.launch_command_parser")
    for case, argv in SPELLINGS.items():
        parsed = api.observe(case, make().parse_args, argv)  # recorded as what it is: an argparse.Namespace
        if parsed is not None:
            args = vars(parsed)
            api.record(f"{case}: given", {name: args[name] for name in sorted(args.get("nondefault", ()))})
            api.record(f"{case}: watched", {name: args.get(name, "<absent>") for name in WATCHED})
    for case, argv in REFUSED.items():
        api.record(f"refused: {case}", _exit_status(make().parse_args, argv))


def _help_sections(text: str) -> dict[str, list[str]]:
    """The option strings each section of a help text lists, in order (usage line and descriptions left out)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        title = _SECTION.match(line)
        if title and not line.startswith("usage:"):
            current = title.group(1)
            sections[current] = []
        elif current is not None and (item := _OPTION_ITEM.match(line)):
            sections[current].extend(part.split()[0] for part in item.group(1).split(", "))
    return sections


def _console_help(api: Api, argv: list[str]) -> tuple[Any, str]:
    """``accelerate launch <argv>`` through the implementation's console script: its exit status and stdout."""
    out = io.StringIO()
    saved = sys.argv
    sys.argv = ["accelerate", "launch", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                status = api.get("commands.accelerate_cli.main")()
            except SystemExit as stopped:
                status = stopped.code
    finally:
        sys.argv = saved
    return status, out.getvalue()


@probe(AREA)
def launch_help(api: Api) -> None:
    """``launch -h`` (every section) and ``launch --use_fsdp -h`` (the sections HF shows for FSDP): the options each
    section lists, the exit status, and the hyphen spellings of destinations found in the text (HF's
    ``test_duplicate_entities``: only ``--num-processes``, once, in the description)."""
    destinations = vars(api.get(f"{LAUNCH}.launch_command_parser")().parse_args(["test.py"]))
    for argv in (["-h"], ["--use_fsdp", "-h"]):
        command = " ".join(["launch", *argv])
        status, text = _console_help(api, argv)
        api.record(f"{command}: exit status", status)
        for title, options in _help_sections(text).items():
            api.record(f"{command}: {title}", options)
        hyphenated = {f"--{name.replace('_', '-')}" for name in destinations if "_" in name}
        api.record(f"{command}: hyphen spellings in the text", {name: text.count(name) for name in sorted(hyphenated)
                                                               if text.count(name)})


def _namespace_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in after.items() if name not in before or before[name] != value}


#: ``_validate_launch_command`` cases: the command line (``{config}`` is the probe's config of that name).
VALIDATE_CASES = {
    "no config": ["train.py", "--lr", "1"],
    "HF's test_validate_launch_command": ["--num-processes", "2", "--deepspeed_config_file", "path/to/be/accepted",
                                         "--config-file", "{validate}", "test.py"],
    "a multi-GPU config, flags given": ["--config_file", "{multi_gpu}", "--cpu", "--num_processes", "3", "train.py"],
    "FSDP 2 with a parallelism config": ["--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config",
                                         "--num_processes", "2", "train.py"],
    "two paradigms": ["--cpu", "--multi_gpu", "train.py"],
    "multi-GPU with one process": ["--multi-gpu", "--num-processes", "1", "train.py"],
    "parallelism config without FSDP": ["--use_parallelism_config", "train.py"],
    "a missing config file": ["--config_file", "{missing}", "train.py"],
    "a config with unknown keys": ["--config_file", "{unknown}", "train.py"],
}


def _configs(api: Api) -> dict[str, str]:
    folder = api.tmp / "configs"
    return {"validate": _write(folder / "validate_launch_cmd.yaml", VALIDATE),
            "multi_gpu": _write(folder / "multi_gpu.yaml", MULTI_GPU),
            "unknown": _write(folder / "invalid_keys.yaml", {**LOCAL, "invalid_key": 1, "another_invalid_key": 2}),
            "missing": str(folder / "missing.yaml")}


def _validated(api: Api, argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` with the implementation's launch parser, validate it; what validation changed and returned."""
    args = api.get(f"{LAUNCH}.launch_command_parser")().parse_args(argv)
    before = dict(vars(args))
    args, defaults, from_config = api.get(f"{LAUNCH}._validate_launch_command")(args)
    return {"filled": _namespace_changes(before, vars(args)), "config": None if defaults is None else defaults.to_dict(),
            "mixed precision from the config": from_config}


@probe(AREA, env={"OMP_NUM_THREADS": "1"})
def validate_launch_command(api: Api) -> None:
    """``_validate_launch_command`` on the implementation's own namespace: the defaults it fills (and its warning),
    the config it reads, its refusals; then with a default config file, read unless ``--cpu``."""
    configs = _configs(api)
    default_file = api.tmp / "hf_home" / "accelerate" / "default_config.yaml"
    with _default_config_at(api, default_file):
        for case, argv in VALIDATE_CASES.items():
            api.observe(case, _validated, api, [part.format(**configs) for part in argv])
        _write(default_file, MULTI_GPU)
        api.observe("a default config", _validated, api, ["train.py"])
        api.observe("a default config and --cpu", _validated, api, ["--cpu", "train.py"])
        default_file.unlink()


@probe(AREA)
def launch_command_config_errors(api: Api) -> None:
    """``launch_command`` with a config file that is missing or has unknown keys: the error, before any process."""
    configs = _configs(api)
    (api.tmp / "train.py").write_text("raise SystemExit('the script ran')\n")
    make = api.get(f"{LAUNCH}.launch_command_parser")
    with _default_config_at(api, api.tmp / "hf_home" / "accelerate" / "default_config.yaml"):
        for case, label in (("missing", "a missing config file"), ("unknown", "a config file with unknown keys")):
            args = make().parse_args(["--config_file", configs[case], "train.py"])
            api.call(label, f"{LAUNCH}.launch_command", args)


@probe(AREA)
def config_files(api: Api) -> None:
    """``load_config_from_file`` of files it refuses (unknown keys, no ``distributed_type``, empty, missing) and of no
    file with no default file; ``config update`` without a file; ``config default`` writing, then refusing to
    overwrite, the default file."""
    load = "commands.config.config_args.load_config_from_file"
    folder = api.tmp / "configs"
    for suffix in (".yaml", ".json"):
        api.call(f"unknown keys ({suffix})", load, _write(folder / f"unknown{suffix}", {**LOCAL, "zeta": 1, "alpha": 2}))
        no_type = {key: value for key, value in LOCAL.items() if key != "distributed_type"}
        api.call(f"no distributed_type ({suffix})", load, _write(folder / f"no_type{suffix}", no_type))
    api.call("a valid file", load, _write(folder / "local.yaml", LOCAL))
    empty = folder / "empty.yaml"
    empty.write_text("")
    api.call("an empty file", load, str(empty))
    api.call("a missing file", load, str(folder / "missing.yaml"))
    default_file = api.tmp / "hf_home" / "accelerate" / "default_config.yaml"
    with _default_config_at(api, default_file):
        api.call("no file and no default file", load, None)
        update = "commands.config.update.update_config"
        api.call("config update: a missing file", update, argparse.Namespace(config_file=str(folder / "missing.yaml")))
        api.call("config update: no file and no default file", update, argparse.Namespace(config_file=None))
        default = "commands.config.default.default_config_command"
        written = argparse.Namespace(save_location=str(default_file), mixed_precision="no")
        api.call("config default: no default file yet", default, written)
        api.call("config default: the default file exists", default, written)
        api.call("config update: the default file", update, argparse.Namespace(config_file=None))


@probe(AREA)
def to_fsdp2(api: Api) -> None:
    """``to-fsdp2``: its refusals in order (no config, no output without ``--overwrite``, an existing output, also
    when ``pathlib.Path.exists`` is patched to say yes as HF's own test does), a conversion, an FSDP 2 config."""
    parser = api.get("commands.to_fsdp2.to_fsdp2_command_parser")()
    command = "commands.to_fsdp2.to_fsdp2_command"
    fsdp1 = _write(api.tmp / "fsdp1.yaml", FSDP1)
    existing = api.tmp / "existing.yaml"
    existing.write_text("kept: true\n")

    def run(label: str, argv: list[str]) -> None:
        api.call(label, command, parser.parse_args(argv))

    run("a missing config file", ["--config_file", str(api.tmp / "missing.yaml"), "--output_file", "out.yaml"])
    run("no output file, no --overwrite", ["--config_file", fsdp1])
    run("an existing output file, no --overwrite", ["--config_file", fsdp1, "--output_file", str(existing)])
    with mock.patch("pathlib.Path.exists", return_value=True):
        run("Path.exists patched: an output file", ["--config_file", fsdp1, "--output_file", "output.yaml"])
    run("a conversion", ["--config_file", fsdp1, "--output_file", str(api.tmp / "fsdp2.yaml")])
    run("an FSDP 2 config", ["--config_file", str(api.tmp / "fsdp2.yaml"), "--output_file", str(api.tmp / "again.yaml")])
    run("--overwrite", ["--config_file", fsdp1, "--overwrite"])
