"""``commands.launch._validate_launch_command`` beside 🤗 Accelerate 1.15's on the same launch namespaces.

Each argument set is parsed twice by HF's launch parser; both validations must leave the same
namespace, return the same config and precision flag, log the same warning, or refuse with the same
exception type and text. accelerate-ref's own ``launch`` refuses HF's flag combinations with HF's
texts, one line and exit 2. Catalog: launch.cli, launch.config_file.
"""

from __future__ import annotations

import enum
import logging
import os

import pytest
import yaml

hf_launch = pytest.importorskip("accelerate.commands.launch")
import accelerate.commands.config.config_args as hf_config_args  # noqa: E402

from accelerate_ref.commands import launch as ref_launch  # noqa: E402
from accelerate_ref.commands.accelerate_cli import run  # noqa: E402
from accelerate_ref.commands.config.config_args import current_default_config_file  # noqa: E402

CONFIGS = {
    "fsdp": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16", "debug": True,
             "num_processes": 2, "num_machines": 1, "use_cpu": False,
             "fsdp_config": {"fsdp_sync_module_states": False, "offload_params": True, "fsdp_version": 2}},
    "multi_gpu": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "mixed_precision": "fp16",
                  "num_processes": 2, "gpu_ids": "0,1", "use_cpu": False, "debug": False,
                  "dynamo_config": {"dynamo_backend": "INDUCTOR", "mode": "max-autotune"}},
    "one_gpu_id": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "mixed_precision": "no",
                   "num_processes": 2, "gpu_ids": "0", "use_cpu": False, "debug": False},
    "no_processes": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no", "num_processes": -1,
                     "use_cpu": False, "debug": False},
}


@pytest.fixture
def configs(tmp_path, monkeypatch):
    """Config files by name, no default config (HF's import-time default paths pointed at the one read now)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for module in (hf_launch, hf_config_args):
        monkeypatch.setattr(module, "default_config_file", current_default_config_file())
    paths = {}
    for name, values in CONFIGS.items():
        paths[name] = str(tmp_path / f"{name}.yaml")
        with open(paths[name], "w") as handle:
            yaml.safe_dump(values, handle)
    paths["absent"] = str(tmp_path / "absent.yaml")
    return paths


def _plain(value):
    return value.value if isinstance(value, enum.Enum) else value


def _validated(module, argv: list[str], caplog):
    """What ``module._validate_launch_command`` does with HF's namespace for ``argv``: its result and warnings, or
    the exception type and text."""
    args = hf_launch.launch_command_parser().parse_args(argv)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        try:
            args, defaults, from_config = module._validate_launch_command(args)
        except Exception as error:  # noqa: BLE001 - the refusal is the observation
            return ("raised", type(error), str(error))
    namespace = {name: _plain(value) for name, value in vars(args).items()}
    config = defaults.to_dict() if defaults is not None else None
    warnings = [record.getMessage() for record in caplog.records if record.name == module.__name__]
    return ("validated", namespace, config, from_config, warnings)


def _both(argv, caplog):
    return _validated(ref_launch, argv, caplog), _validated(hf_launch, argv, caplog)


@pytest.mark.parametrize("omp_threads", ["1", None])
@pytest.mark.parametrize("argv", [
    ["train.py", "--lr", "1"],
    ["--cpu", "--num_processes", "2", "train.py"],
    ["--multi_gpu", "--num_processes", "2", "--mixed_precision", "bf16", "--debug", "train.py"],
    ["--use_fsdp", "--fsdp_version", "2", "--use_parallelism_config", "--num_processes", "2", "train.py"],
], ids=["defaults", "cpu", "multi_gpu", "fsdp2_parallelism"])
def test_without_a_config_the_defaults_and_warning_are_hfs(configs, argv, omp_threads, monkeypatch, caplog):
    if omp_threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_threads)
    ours, theirs = _both(argv, caplog)
    assert ours[0] == "validated" and ours[2] is None
    assert len(ours[4]) == 1 and "`--num_machines` was set to a value of `1`" in ours[4][0]
    assert ours == theirs


@pytest.mark.parametrize("config, flags", [
    ("fsdp", ["--num-processes", "2", "--deepspeed_config_file", "path/to/be/accepted"]),  # HF's own test's case
    ("fsdp", ["--fsdp_sync_module_states", "true", "--mixed_precision", "no"]),  # a given flag beats the section
    ("multi_gpu", []),
    ("multi_gpu", ["--cpu", "--num_processes", "3"]),
])
def test_a_config_fills_what_no_flag_gave_as_hf(configs, config, flags, caplog):
    ours, theirs = _both(["--config_file", configs[config], *flags, "train.py"], caplog)
    assert ours[0] == "validated" and ours[2] is not None
    assert ours == theirs
    if config == "fsdp" and "--fsdp_sync_module_states" not in flags:
        assert ours[1]["fsdp_sync_module_states"] is False and ours[1]["debug"] is True and ours[3] is True
        assert ours[1]["deepspeed_config_file"] == "path/to/be/accepted" and ours[1]["num_processes"] == 2


def test_the_default_config_is_read_unless_cpu_as_in_hf(configs, caplog):
    default_file = current_default_config_file()
    os.makedirs(os.path.dirname(default_file))
    with open(default_file, "w") as handle:
        yaml.safe_dump(CONFIGS["multi_gpu"], handle)
    for argv in (["train.py"], ["--cpu", "train.py"]):
        ours, theirs = _both(argv, caplog)
        assert ours == theirs
        assert (ours[2] is None) == ("--cpu" in argv)


@pytest.mark.parametrize("argv, config", [
    (["--cpu", "--multi_gpu"], None),
    (["--use_deepspeed", "--use_fsdp"], None),
    (["--multi_gpu", "--num_processes", "1"], None),
    (["--use_parallelism_config"], None),
    ([], "one_gpu_id"),
    ([], "no_processes"),
    ([], "absent"),
])
def test_refusals_are_hfs(configs, argv, config, caplog):
    config_flags = ["--config_file", configs[config]] if config else []
    ours, theirs = _both([*config_flags, *argv, "train.py"], caplog)
    assert ours[0] == "raised"
    assert ours == theirs


def test_bf16_without_support_is_refused_as_in_hf(configs, monkeypatch, caplog):
    monkeypatch.setattr(ref_launch, "is_bf16_available", lambda ignore_tpu=False: False)
    monkeypatch.setattr(hf_launch, "is_bf16_available", lambda ignore_tpu=False: False)
    ours, theirs = _both(["--config_file", configs["multi_gpu"], "--mixed_precision", "bf16", "train.py"], caplog)
    assert ours[:2] == ("raised", ValueError) and ours == theirs


def test_accelerate_refs_own_namespace_validates(configs):
    args = ref_launch.launch_command_parser().parse_args(["--config_file", configs["multi_gpu"], "train.py"])
    args, defaults, from_config = ref_launch._validate_launch_command(args)
    assert args.multi_gpu and args.use_fsdp is False and args.mixed_precision == "fp16" and from_config
    assert args.num_processes == 2 and defaults.gpu_ids == "0,1"


@pytest.mark.parametrize("argv, message", [
    (["--cpu", "--multi_gpu"], "You can only use one of `--cpu`, `--multi_gpu`, `--tpu`, `--use_deepspeed`, `--use_fsdp` at a time."),
    (["--multi_gpu", "--num_processes", "1"], "You need to use at least 2 processes to use `--multi_gpu`."),
])
def test_the_launch_command_refuses_hfs_combinations_in_one_line(tmp_path, argv, message, capsys):
    script = tmp_path / "train.py"
    script.write_text("")
    assert run(["launch", *argv, str(script)]) == 2
    assert capsys.readouterr().err == f"accelerate-ref launch: error: {message}\n"
