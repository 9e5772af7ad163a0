"""Probes of ``accelerate launch``'s ParallelismConfig keys: the ``--parallelism_config_*`` options and a config
file's ``parallelism_config`` section, through ``_validate_launch_command`` and
``utils.launch.prepare_extend_env_parallelism_config`` to the ``PARALLELISM_CONFIG_*`` variables a rank gets, and
the `ParallelismConfig` (with its handlers) that a rank builds from them.

No probe launches a process; the default config file is the probe folder's (as in ``commands``).
"""

from __future__ import annotations

import os
from typing import Any

from ..probe import Api, probe
from .commands import LAUNCH, LOCAL, _default_config_at, _exit_status, _write

AREA = "commands"
#: The paradigm ``--use_parallelism_config`` needs (HF: FSDP version 2).
FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config", "--num_processes", "8"]
#: Command lines that carry a ParallelismConfig (each ends with the script).
FLAG_CASES = {
    "the defaults": [*FSDP2, "train.py"],
    "fsdp x tp": [*FSDP2, "--parallelism_config_dp_shard_size", "4", "--parallelism_config_tp_size", "2", "train.py"],
    "hsdp x cp, alltoall": [*FSDP2, "--parallelism_config_dp_replicate_size", "2", "--parallelism_config_dp_shard_size",
                            "2", "--parallelism_config_cp_size", "2", "--parallelism_config_cp_comm_strategy",
                            "alltoall", "train.py"],
    "a strategy without cp": [*FSDP2, "--parallelism_config_cp_comm_strategy", "alltoall", "train.py"],
    "sp with a fixed length": [*FSDP2, "--parallelism_config_dp_shard_size", "4", "--parallelism_config_sp_size", "2",
                               "--parallelism_config_sp_seq_length", "128", "--parallelism_config_sp_seq_length_is_variable",
                               "", "--parallelism_config_sp_attn_implementation", "flash_attention_2", "train.py"],
    "sizes a configuration refuses": [*FSDP2, "--parallelism_config_dp_replicate_size", "2",
                                      "--parallelism_config_tp_size", "2", "train.py"],
}
#: Command lines the launch parser refuses (argparse's exit status).
REFUSED = {
    "an unknown cp backend": ["--parallelism_config_cp_backend", "ring", "train.py"],
    "an unknown sp backend": ["--parallelism_config_sp_backend", "ulysses", "train.py"],
    "a size that is not a number": ["--parallelism_config_tp_size", "two", "train.py"],
}
#: A config file as ``accelerate config`` writes it for FSDP 2 with a parallelism config (keys with their prefix).
CONFIG_FILE = {**LOCAL, "distributed_type": "FSDP", "num_processes": 8, "fsdp_config": {"fsdp_version": 2},
               "parallelism_config": {"parallelism_config_dp_shard_size": 2, "parallelism_config_cp_size": 2,
                                      "parallelism_config_tp_size": 2, "parallelism_config_cp_comm_strategy": "alltoall"}}


def _environment(api: Api, argv: list[str]) -> dict[str, str]:
    """The variables ``prepare_extend_env_parallelism_config`` adds after ``_validate_launch_command`` of ``argv``."""
    args = api.get(f"{LAUNCH}.launch_command_parser")().parse_args(argv)
    args, _, _ = api.get(f"{LAUNCH}._validate_launch_command")(args)
    added = api.get("utils.launch.prepare_extend_env_parallelism_config")(args, {})
    return dict(sorted(added.items()))


def _rank_config(api: Api, environment: dict[str, str]) -> dict[str, Any]:
    """The `ParallelismConfig` a rank builds from ``environment`` (the Accelerator's default one): its mesh and the
    handlers' fields."""
    os.environ.update(environment)
    config = api.get("ParallelismConfig")()
    handlers = {name: getattr(config, f"{name}_handler") for name in ("tp", "cp", "sp")}
    return {"mesh": config._get_mesh(), **{f"{name} handler": None if handler is None else vars(handler)
                                         for name, handler in handlers.items()}}


def _observe_launch(api: Api, label: str, argv: list[str]) -> None:
    environment = api.observe(label, _environment, api, argv)
    if environment is not None:
        api.observe(f"{label}: the rank's ParallelismConfig", _rank_config, api, environment)


@probe(AREA, env={"OMP_NUM_THREADS": "1"})
def parallelism_config_launch_options(api: Api) -> None:
    """The ``--parallelism_config_*`` options: the variables they become, the configuration a rank builds from them
    (refusals included), and the options the parser refuses."""
    with _default_config_at(api, api.tmp / "hf_home" / "accelerate" / "default_config.yaml"):
        for label, argv in FLAG_CASES.items():
            _observe_launch(api, label, argv)
    make = api.get(f"{LAUNCH}.launch_command_parser")
    for label, argv in REFUSED.items():
        api.record(label, _exit_status(make().parse_args, [*FSDP2, *argv]))


@probe(AREA, env={"OMP_NUM_THREADS": "1"})
def parallelism_config_from_a_config_file(api: Api) -> None:
    """A config file's ``parallelism_config`` section: the flag it implies, its keys as options (a flag given wins),
    the variables and the rank's configuration; the same section without the key prefix."""
    with _default_config_at(api, api.tmp / "hf_home" / "accelerate" / "default_config.yaml"):
        path = _write(api.tmp / "configs" / "nd.yaml", CONFIG_FILE)
        _observe_launch(api, "a config file", ["--config_file", path, "train.py"])
        _observe_launch(api, "a config file and a flag", ["--config_file", path, "--parallelism_config_tp_size", "1",
                                                          "train.py"])
        unprefixed = {key.removeprefix("parallelism_config_"): value
                      for key, value in CONFIG_FILE["parallelism_config"].items()}
        path = _write(api.tmp / "configs" / "unprefixed.yaml", {**CONFIG_FILE, "parallelism_config": unprefixed})
        _observe_launch(api, "a section without the key prefix", ["--config_file", path, "train.py"])
