"""``accelerate-ref env``: what a bug report needs (catalog ``launch.env``).

Platform, Python, torch and accelerate-ref versions, the accelerators torch
finds, and the active config (the file ``launch`` would read, and its keys).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform

import torch

from .config.config_args import ConfigError, current_default_config_file, default_config_file, load_config_from_file  # noqa: F401



def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


version = _version("accelerate-ref")


def accelerators() -> str:
    """The accelerators torch reports on this machine (``none`` when it finds only the CPU)."""
    found = []
    if torch.cuda.is_available():
        found.append(f"cuda x{torch.cuda.device_count()} ({torch.cuda.get_device_name(0)})")
    for family in ("xpu", "npu", "mps"):
        module = getattr(torch, family, None) if family != "mps" else getattr(torch.backends, "mps", None)
        if module is not None and getattr(module, "is_available", lambda: False)():
            found.append(family)
    return ", ".join(found) or "none"


def env_command(args: argparse.Namespace) -> int:
    path = args.config_file or current_default_config_file()
    info = {
        "`accelerate-ref` version": version,
        "`accelerate` version": _version("accelerate"),
        "Platform": platform.platform(),
        "Python version": platform.python_version(),
        "PyTorch version": torch.__version__,
        "Accelerators": accelerators(),
        "CPU count": str(os.cpu_count()),
        "Config file": path,
    }
    print("Copy-and-paste the text below in your GitHub issue\n")
    for key, value in info.items():
        print(f"- {key}: {value}")
    try:
        config = load_config_from_file(path) if os.path.isfile(path) else None
    except ValueError as error:  # unknown keys, no distributed_type, not a YAML mapping (ConfigError)
        print(f"- Active config: unusable ({error})")
        return 0
    if config is None:
        print("- Active config: not found")
    else:
        print("- Active config:")
        for key, value in config.to_dict().items():
            print(f"\t- {key}: {value}")
    return 0


def env_command_parser(subparsers=None):
    """The ``env`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser("env", help="print versions, platform, accelerators and the active config")
    else:
        parser = argparse.ArgumentParser("accelerate-ref env command")
    parser.add_argument("--config_file", "--config-file", default=None)
    if subparsers is not None:
        parser.set_defaults(func=env_command)
    return parser


def main() -> int:
    """``python -m accelerate_ref.commands.env``."""
    return env_command(env_command_parser().parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
