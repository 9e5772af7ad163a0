"""``accelerate-ref config``: write the launcher's YAML, by prompts (read from stdin) or as defaults.

``config`` asks the questions 🤗 Accelerate's ``accelerate config`` asks for a
local machine and writes ``--config_file`` (default: the location rule of
``launch.config_location``); ``config default`` is ``write_basic_config``.
"""

from __future__ import annotations

import argparse
from typing import Callable

from .config_args import ClusterConfig, default_config_file
from .default import PRECISIONS, write_basic_config

MACHINE_TYPES = {"no": "NO", "multi-cpu": "MULTI_CPU", "multi-gpu": "MULTI_GPU", "tpu": "XLA"}


class PromptError(ValueError):
    """An answer the config questions cannot use."""


def _ask(question: str, convert: Callable[[str], object], default: object) -> object:
    try:
        answer = input(f"{question} [{default}]: ").strip()
    except EOFError:
        raise PromptError(f"no answer to {question!r} (stdin ended)") from None
    if not answer:
        return default
    try:
        return convert(answer)
    except ValueError:
        raise PromptError(f"{answer!r} is not a valid answer to {question!r}") from None


def _choice(options) -> Callable[[str], str]:
    def convert(answer: str) -> str:
        if answer.lower() not in options:
            raise ValueError(answer)
        return answer.lower()

    return convert


def _yes_no(answer: str) -> bool:
    if answer.lower() in ("y", "yes", "true"):
        return True
    if answer.lower() in ("n", "no", "false"):
        return False
    raise ValueError(answer)


def get_user_input() -> ClusterConfig:
    """Ask the local-machine questions on stdin and return the config they describe."""
    machine = _ask(f"Which type of machine are you using? ({', '.join(MACHINE_TYPES)})", _choice(MACHINE_TYPES), "no")
    distributed_type = MACHINE_TYPES[machine]
    num_machines, machine_rank, ip, port = 1, 0, None, None
    if distributed_type != "NO":
        num_machines = _ask("How many different machines will you use?", int, 1)
        if num_machines > 1:
            machine_rank = _ask("What is the rank of this machine?", int, 0)
            ip = _ask("What is the IP address of the machine that will host the main process?", str, "127.0.0.1")
            port = _ask("What is the port you will use to communicate with the main process?", int, 29500)
    use_cpu = distributed_type in ("NO", "MULTI_CPU") and _ask("Do you want to run on CPU only? (yes/no)", _yes_no, distributed_type == "MULTI_CPU")
    num_processes = 1 if distributed_type == "NO" else _ask("How many processes in total?", int, 2)
    precision = _ask(f"Do you wish to use mixed precision? ({'/'.join(PRECISIONS)})", _choice(PRECISIONS), "no")
    return ClusterConfig(
        distributed_type=distributed_type,
        mixed_precision=precision,
        use_cpu=bool(use_cpu),
        num_processes=num_processes,
        num_machines=num_machines,
        machine_rank=machine_rank,
        main_process_ip=ip,
        main_process_port=port,
    )


def config_command(args: argparse.Namespace) -> int:
    """Run ``config`` (prompts) or ``config default``; return the exit status."""
    path = args.config_file or default_config_file()
    if args.config_subcommand == "default":
        written = write_basic_config(args.mixed_precision, path)
        if written:
            print(f"accelerate-ref configuration saved at {written}")
        return 0
    config = get_user_input()
    config.to_yaml_file(path)
    print(f"accelerate-ref configuration saved at {path}")
    return 0


def config_command_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("config", help="write the launcher's config (prompts on stdin, or `config default`)")
    parser.add_argument("--config_file", "--config-file", default=None, help="where to write (default: the HF cache location)")
    nested = parser.add_subparsers(dest="config_subcommand")
    default = nested.add_parser("default", help="write a basic config for this machine (write_basic_config)")
    default.add_argument("--config_file", "--config-file", default=argparse.SUPPRESS)
    default.add_argument("--mixed_precision", "--mixed-precision", default="no", choices=PRECISIONS)
    parser.set_defaults(func=config_command, config_subcommand=None)
    return parser
