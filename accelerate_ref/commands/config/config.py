"""``accelerate-ref config``: write the launcher's YAML from answers read on stdin.

``config`` asks the questions 🤗 Accelerate's ``accelerate config`` asks for a
local machine (one line per answer instead of its arrow-key menus) and writes
``--config_file`` (default: the location rule of ``launch.config_location``,
applied when the command runs); a path ending in ``.json`` is written as JSON.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from .config_args import cache_dir, current_default_config_file, default_config_file, default_yaml_config_file, load_config_from_file  # noqa: F401
from .config_args import ClusterConfig
from .default import PRECISIONS

description = (
    "Launches a series of prompts to create and save a `default_config.yaml` configuration file for your training "
    "system. Should always be ran first on your machine"
)

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
        compute_environment="LOCAL_MACHINE",
        distributed_type=distributed_type,
        mixed_precision=precision,
        use_cpu=bool(use_cpu),
        debug=False,
        num_processes=num_processes,
        num_machines=num_machines,
        machine_rank=machine_rank,
        main_process_ip=ip,
        main_process_port=port,
    )


def config_command(args: argparse.Namespace) -> None:
    """Ask the questions, then write ``args.config_file`` (default: the location rule, applied now)."""
    config = get_user_input()
    config_file = args.config_file if args.config_file is not None else current_default_config_file()
    os.makedirs(os.path.dirname(os.path.abspath(config_file)), exist_ok=True)
    if config_file.endswith(".json"):
        config.to_json_file(config_file)
    else:
        config.to_yaml_file(config_file)
    print(f"accelerate configuration saved at {config_file}")


def config_command_parser(subparsers=None):
    """The ``config`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    if subparsers is not None:
        parser = subparsers.add_parser("config", description=description, help="write the launcher's config")
    else:
        parser = argparse.ArgumentParser("accelerate-ref config command", description=description)
    parser.add_argument("--config_file", "--config-file", default=None,
                        help="where to write (default: default_config.yaml under $HF_HOME/accelerate)")
    if subparsers is not None:
        parser.set_defaults(func=config_command)
    return parser


def main():
    """``python -m accelerate_ref.commands.config.config``: ask, then write."""
    parser = config_command_parser()
    config_command(parser.parse_args())


if __name__ == "__main__":
    main()
