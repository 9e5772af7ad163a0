"""``accelerate-ref tpu-config``: run set-up commands on every worker of a TPU VM pod through ``gcloud``.

The commands come from ``--command`` (repeatable) or ``--command_file``, else the config
file's ``commands``/``command_file``; ``--tpu_name``/``--tpu_zone`` default to the config's.
They run in ``/usr/share`` after an optional ``pip install`` of accelerate. With
``--debug`` the ``gcloud`` command line is printed, not run. As in 🤗 Accelerate 1.15;
running it needs the Google Cloud SDK (``gcloud``) and a TPU pod.
"""

from __future__ import annotations

import argparse
import os
import subprocess

from packaging.version import InvalidVersion, Version

from .config.config_args import current_default_config_file, default_config_file, load_config_from_file  # noqa: F401

_description = "Run commands across TPU VMs for initial setup before running `accelerate launch`."


def tpu_command_parser(subparsers=None):
    """The ``tpu-config`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=_description, help=_description)
    else:
        parser = argparse.ArgumentParser("accelerate-ref tpu-config command", description=_description)
    config_args = parser.add_argument_group("Config Arguments", "Arguments that can be configured through `accelerate config`.")
    config_args.add_argument("--config_file", type=str, default=None, help="the config file to read")
    config_args.add_argument("--tpu_name", default=None, help="the TPU (default: the config's)")
    config_args.add_argument("--tpu_zone", default=None, help="the TPU's zone (default: the config's)")
    pod_args = parser.add_argument_group("TPU Arguments", "Arguments for options ran inside the TPU.")
    pod_args.add_argument("--use_alpha", action="store_true", help="use `gcloud alpha`")
    pod_args.add_argument("--command_file", default=None, help="a file of commands to run on the pod")
    pod_args.add_argument("--command", action="append", nargs="+", help="a command to run on the pod (repeatable)")
    pod_args.add_argument("--install_accelerate", action="store_true", help="pip install accelerate on the pod first")
    pod_args.add_argument("--accelerate_version", default="latest", help="the version to install: a version, `latest` or `dev`")
    pod_args.add_argument("--debug", action="store_true", help="print the gcloud command instead of running it")
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def _pip_target(version: str) -> str:
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accelerate -U"
    try:
        Version(version)
    except InvalidVersion:
        raise ValueError(f"--accelerate_version {version!r} is not a version, `latest` or `dev`") from None
    return f"accelerate=={version}"


def _fill_from_config(args: argparse.Namespace) -> None:
    config_file = args.config_file
    if config_file is None:
        config_file = current_default_config_file()
        if not os.path.isfile(config_file):
            return
    defaults = load_config_from_file(config_file)
    if not args.command_file and defaults.command_file is not None and not args.command:
        args.command_file = defaults.command_file
    if not args.command and defaults.commands is not None:
        args.command = defaults.commands
    args.tpu_name = args.tpu_name or defaults.tpu_name
    args.tpu_zone = args.tpu_zone or defaults.tpu_zone


def tpu_command_launcher(args):
    """Build the ``gcloud compute tpus tpu-vm ssh`` command for ``args`` and run it (print it with ``--debug``)."""
    _fill_from_config(args)
    args.accelerate_version = _pip_target(args.accelerate_version)
    if not args.command_file and not args.command:
        raise ValueError("You must specify either a command file or a command to run on the pod.")
    if args.command_file:
        with open(args.command_file) as handle:
            args.command = [handle.read().splitlines()]
    if isinstance(args.command[0], list):
        args.command = [line for group in args.command for line in group]
    steps = ["cd /usr/share"] + ([f"pip install {args.accelerate_version}"] if args.install_accelerate else []) + list(args.command)
    args.command = "; ".join(steps)
    cmd = ["gcloud", *(["alpha"] if args.use_alpha else []), "compute", "tpus", "tpu-vm", "ssh", args.tpu_name,
           "--zone", args.tpu_zone, "--command", args.command, "--worker", "all"]
    if args.debug:
        print(f"Running {' '.join(cmd)}")
        return
    code = subprocess.run(cmd).returncode
    if code != 0:  # 🤗 Accelerate reports success whatever gcloud returned; a failure here is one line, exit 1
        raise ChildProcessError(f"gcloud exited with code {code}; the pod was not set up")
    print("Successfully setup pod.")


def main():
    """``python -m accelerate_ref.commands.tpu ...``."""
    tpu_command_launcher(tpu_command_parser().parse_args())


if __name__ == "__main__":
    main()
