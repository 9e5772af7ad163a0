"""The launcher's names beyond the documents, run side by side with 🤗 Accelerate 1.15's on the same input.

Config files (``commands.config.config_args``): a file written by one is read by the other
with equal fields (YAML and JSON, ``ClusterConfig`` and ``SageMakerConfig``), and both refuse
an unknown key and a missing ``distributed_type``. Launch helpers (``utils.launch``,
``utils.other``, ``utils.tqdm``, ``launchers``): the same namespace gives the same
environment, command and namespace changes. Catalog: launch.config_file, launch.config_location,
config.write_basic_config, launch.cli.

``commands.launch._validate_launch_command`` beside 🤗 Accelerate 1.15's on the same launch namespaces.

Each argument set is parsed twice by HF's launch parser; both validations must leave the same
namespace, return the same config and precision flag, log the same warning, or refuse with the same
exception type and text. accelerate-ref's own ``launch`` refuses HF's flag combinations with HF's
texts, one line and exit 2. Catalog: launch.cli, launch.config_file.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import logging
import os
import socket

import pytest
import yaml

from accelerate_ref.commands import launch as ref_launch_command  # noqa: E402
from accelerate_ref.commands.accelerate_cli import run  # noqa: E402
from accelerate_ref.commands.config.config_args import current_default_config_file  # noqa: E402

hf_config_args = pytest.importorskip("accelerate.commands.config.config_args")
import accelerate.launchers as hf_launchers  # noqa: E402
import accelerate.utils.launch as hf_launch  # noqa: E402
import accelerate.utils.other as hf_other  # noqa: E402

import accelerate_ref.launchers as ref_launchers  # noqa: E402
import accelerate_ref.utils.launch as ref_launch  # noqa: E402
import accelerate_ref.utils.other as ref_other  # noqa: E402
from accelerate_ref.commands.config import config_args as ref_config_args  # noqa: E402
from accelerate_ref.commands.config.default import write_basic_config as ref_write_basic_config  # noqa: E402

CLUSTER = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "mixed_precision": "bf16",
    "use_cpu": False,
    "debug": True,
    "num_processes": 8,
    "machine_rank": 1,
    "num_machines": 2,
    "gpu_ids": "0,1,2,3",
    "main_process_ip": "10.0.0.1",
    "main_process_port": 29555,
    "same_network": True,
    "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_offload_params": False},
    "dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": "default"},
    "tpu_env": [],
    "commands": ["echo hi"],
    "downcast_bf16": "no",
}
SAGEMAKER = {
    "compute_environment": "AMAZON_SAGEMAKER",
    "distributed_type": "DATA_PARALLEL",
    "mixed_precision": "fp16",
    "use_cpu": False,
    "debug": False,
    "ec2_instance_type": "ml.p3.16xlarge",
    "iam_role_name": "role",
    "profile": "default",
    "num_machines": 2,
    "additional_args": {"max_run": 3600},
}


def _write(path, values) -> str:
    with open(path, "w") as handle:
        if str(path).endswith(".json"):
            import json

            json.dump(values, handle)
        else:
            yaml.safe_dump(values, handle)
    return str(path)


@pytest.mark.parametrize("values", [CLUSTER, SAGEMAKER], ids=["cluster", "sagemaker"])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_written_by_one_is_read_by_the_other_with_equal_fields(tmp_path, values, suffix):
    source = _write(tmp_path / f"source{suffix}", values)
    ours, theirs = ref_config_args.load_config_from_file(source), hf_config_args.load_config_from_file(source)
    assert type(ours).__name__ == type(theirs).__name__ == ("SageMakerConfig" if "iam_role_name" in values else "ClusterConfig")
    assert ours.to_dict() == theirs.to_dict()
    for writer, reader, name in ((ours, hf_config_args, "ours"), (theirs, ref_config_args, "theirs")):
        written = str(tmp_path / f"written_by_{name}{suffix}")
        (writer.to_json_file if suffix == ".json" else writer.to_yaml_file)(written)
        again = reader.load_config_from_file(written)
        assert again.to_dict() == ours.to_dict(), f"a file written by {name} reads back differently"
    assert open(str(tmp_path / f"written_by_ours{suffix}")).read() == open(str(tmp_path / f"written_by_theirs{suffix}")).read()


def test_fields_defaults_and_enums_match(tmp_path):
    for name in ("BaseConfig", "ClusterConfig", "SageMakerConfig"):
        ref_fields = [(f.name, f.default) for f in dataclasses.fields(getattr(ref_config_args, name))]
        hf_fields = [(f.name, f.default) for f in dataclasses.fields(getattr(hf_config_args, name))]
        assert ref_fields == hf_fields, name
    ours = ref_config_args.ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPU", mixed_precision="no", use_cpu=False, debug=False)
    assert ours.distributed_type.value == "MULTI_GPU" and ours.fsdp_config == {} and ours.dynamo_config == {}
    assert ours.num_processes == -1 and ours.same_network is False


@pytest.mark.parametrize("content, words", [
    ({"distributed_type": "NO", "fancy_key": 1}, "fancy_key"),
    ({"mixed_precision": "bf16"}, "distributed_type"),
])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_unknown_keys_and_a_missing_distributed_type_are_value_errors(tmp_path, content, words, suffix):
    path = _write(tmp_path / f"bad{suffix}", content)
    for module in (hf_config_args, ref_config_args):
        reader = module.ClusterConfig.from_json_file if suffix == ".json" else module.ClusterConfig.from_yaml_file
        with pytest.raises(ValueError, match=words):
            reader(path)


def test_process_config_converts_old_keys_as_accelerate_does():
    old = {"distributed_type": "NO", "fp16": True, "dynamo_backend": "INDUCTOR"}
    assert ref_config_args.BaseConfig.process_config(dict(old)) == hf_config_args.BaseConfig.process_config(dict(old))
    no_dynamo = {"distributed_type": "MULTI_CPU", "dynamo_backend": "NO"}
    assert ref_config_args.BaseConfig.process_config(dict(no_dynamo)) == hf_config_args.BaseConfig.process_config(dict(no_dynamo))


def test_module_constants_follow_the_location_rule_at_import():
    for name in ("hf_cache_home", "cache_dir", "default_json_config_file", "default_yaml_config_file", "default_config_file"):
        assert getattr(ref_config_args, name) == getattr(hf_config_args, name), name


def test_the_launcher_applies_the_location_rule_when_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "later"))
    assert ref_config_args.current_default_config_file() == str(tmp_path / "later" / "accelerate" / "default_config.yaml")
    assert ref_config_args.default_config_file != ref_config_args.current_default_config_file(), "the module constant is fixed at import"
    (tmp_path / "later" / "accelerate").mkdir(parents=True)
    legacy = _write(tmp_path / "later" / "accelerate" / "default_config.json", {"distributed_type": "NO"})
    assert ref_config_args.current_default_config_file() == legacy, "an old JSON file alone is still found"


def test_write_basic_config_writes_what_accelerate_writes(tmp_path, capsys):
    ours, theirs = str(tmp_path / "ours" / "c.yaml"), str(tmp_path / "theirs" / "c.yaml")
    from accelerate.commands.config.default import write_basic_config as hf_write_basic_config

    assert str(ref_write_basic_config("bf16", ours)) == ours  # a pathlib.Path, as HF 1.15 returns
    assert str(hf_write_basic_config("bf16", theirs)) == theirs
    assert hf_config_args.load_config_from_file(ours).to_dict() == hf_config_args.load_config_from_file(theirs).to_dict()
    assert ref_write_basic_config("fp16", ours) is False and "will not override" in capsys.readouterr().out


def test_ports_as_accelerate_sees_them():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert ref_other.is_port_in_use(port) is hf_other.is_port_in_use(port) is True
    assert ref_other.is_port_in_use(port) is hf_other.is_port_in_use(port) is False
    free = ref_other.get_free_port()
    with socket.socket() as check:
        check.bind(("", free))  # really free


@pytest.mark.parametrize("local_index", [0, 1])
def test_tqdm_draws_on_the_main_process_only(monkeypatch, local_index):
    import sys

    import accelerate_ref.state as ref_state
    from accelerate_ref.utils import tqdm as ref_tqdm

    class Rank:
        local_process_index = local_index

    hf_tqdm = sys.modules["accelerate.utils.tqdm"]  # `accelerate.utils.tqdm` is the function, as ours
    monkeypatch.setattr(ref_state, "PartialState", Rank)
    monkeypatch.setattr(hf_tqdm, "PartialState", Rank)
    for kwargs in ({}, {"main_process_only": False}, {"disable": True}):
        ours, theirs = ref_tqdm(range(3), **kwargs), hf_tqdm.tqdm(range(3), **kwargs)
        assert ours.disable == theirs.disable, kwargs
        ours.close(), theirs.close()
    for function in (ref_tqdm, hf_tqdm.tqdm):
        with pytest.raises(ValueError):
            function(True, range(3))


def _hf_launch_args(argv: list[str]) -> argparse.Namespace:
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser().parse_args([*argv, "train.py", "--lr", "1"])


def _side_by_side(function_name: str, args: argparse.Namespace, *extra):
    """Run ours and HF's ``function_name`` on copies of ``args``; return both results and both namespaces."""
    ours_args, theirs_args = copy.deepcopy(args), copy.deepcopy(args)
    ours = getattr(ref_launch, function_name)(ours_args, *copy.deepcopy(extra))
    theirs = getattr(hf_launch, function_name)(theirs_args, *copy.deepcopy(extra))
    return ours, theirs, vars(ours_args), vars(theirs_args)


def test_setup_fp8_env_and_parallelism_env_match():
    args = _hf_launch_args(["--fp8_backend", "te", "--fp8_format", "HYBRID"])
    args.fp8_override_linear_precision = (True, False, True)
    args.parallelism_config_cp_size, args.parallelism_config_sp_size = 2, 2
    args.parallelism_config_cp_comm_strategy, args.parallelism_config_sp_seq_length = "alltoall", 128
    ours, theirs, _, _ = _side_by_side("setup_fp8_env", args, {})
    assert ours == theirs and "ACCELERATE_FP8_BACKEND" in ours and "ACCELERATE_FP8_OVERRIDE_DGRAD" in ours
    ours, theirs, _, _ = _side_by_side("prepare_extend_env_parallelism_config", args, {})
    assert ours == theirs and ours["PARALLELISM_CONFIG_CP_COMM_STRATEGY"] == "alltoall"


@pytest.mark.parametrize("argv", [
    ["--num_processes", "2", "--num_machines", "1", "--zero_stage", "3", "--gradient_clipping", "1.0", "--offload_param_device", "cpu", "--gpu_ids", "0,1"],
    ["--num_processes", "8", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
     "--deepspeed_hostfile", "hosts", "--deepspeed_exclusion_filter", "host1", "--module"],
    ["--num_processes", "8", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
     "--deepspeed_multinode_launcher", "standard", "--same_network"],
], ids=["one-machine", "pdsh-runner", "standard-torchrun"])
def test_prepare_deepspeed_cmd_env_matches(argv):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = _hf_launch_args([*argv, "--mixed_precision", "bf16", "--main_process_port", str(port)])
    args.deepspeed_fields_from_accelerate_config = ["zero_stage", "gradient_clipping"]  # the launcher fills it from the config
    (ours_cmd, ours_env), (theirs_cmd, theirs_env), ours_args, theirs_args = _side_by_side("prepare_deepspeed_cmd_env", args)
    assert ours_cmd == theirs_cmd and ours_env == theirs_env and ours_args == theirs_args
    assert ours_env["ACCELERATE_USE_DEEPSPEED"] == "true"


def test_prepare_tpu_and_env_var_path_add_match(monkeypatch):
    args = _hf_launch_args(["--tpu", "--mixed_precision", "bf16", "--debug", "--vm", "a", "--vm", "b"])
    args.tpu_vm, args.tpu_name = args.vm, "pod"
    for pod in (False, True):
        (ours_args, ours_env), (theirs_args, theirs_env), _, _ = _side_by_side("prepare_tpu", args, {}, pod)
        assert vars(ours_args) == vars(theirs_args) and ours_env == theirs_env
    monkeypatch.setenv("PYTHONPATH", "/a::/b")
    assert ref_launch.env_var_path_add("PYTHONPATH", "/c") == hf_launch.env_var_path_add("PYTHONPATH", "/c") == "/a:/b:/c"


@pytest.mark.parametrize("distributed_type, debug", [("MULTI_CPU", False), ("NO", False)])
def test_prepare_for_launch_sets_the_rank_environment_as_accelerate_does(monkeypatch, distributed_type, debug):
    monkeypatch.setenv("NPROC", "4")
    monkeypatch.setenv("NODE_RANK", "1")
    seen = {}
    for name, cls in (("ours", ref_launch.PrepareForLaunch), ("theirs", hf_launch.PrepareForLaunch)):
        for key in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED"):
            monkeypatch.setenv(key, "unset")  # recorded, so the variables the launcher sets are removed afterwards
            monkeypatch.delenv(key)
        called = []
        cls(lambda *a: called.append(a), distributed_type=distributed_type, debug=debug)(2, "x", 3)
        seen[name] = ({k: os.environ.get(k) for k in ("LOCAL_RANK", "RANK", "FORK_LAUNCHED")}, called)
    assert seen["ours"] == seen["theirs"]


def test_notebook_launcher_passes_the_rendezvous_options_as_accelerate_does(monkeypatch):
    from torch.distributed.launcher import api

    built = []

    @dataclasses.dataclass
    class Recording(api.LaunchConfig):
        def __post_init__(self):
            built.append(self)
            super().__post_init__()

    monkeypatch.setattr(api, "LaunchConfig", Recording)
    monkeypatch.setattr(api, "elastic_launch", lambda config, entrypoint: (lambda *args: None))
    options = dict(num_processes=2, use_port="29611", node_rank=0, num_nodes=1, rdzv_conf={"timeout": 60},
                   rdzv_id="job7", max_restarts=1, log_line_prefix_template="[{role_name}{rank}]")
    for launcher in (ref_launchers.notebook_launcher, hf_launchers.notebook_launcher):
        launcher(print, **copy.deepcopy(options))
    kept = ("min_nodes", "max_nodes", "nproc_per_node", "run_id", "rdzv_backend", "rdzv_endpoint", "rdzv_configs",
            "max_restarts", "monitor_interval", "start_method", "log_line_prefix_template")
    ours, theirs = ({name: getattr(config, name) for name in kept} for config in built)
    assert ours == theirs and ours["rdzv_endpoint"] == "127.0.0.1:29611" and ours["run_id"] == "job7"


# --- command modules: to-fsdp2, tpu-config, merge-weights, commands.utils, the CLI's one-line errors ---

FSDP1_CONFIG = {
    "compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 2,
    "fsdp_config": {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False, "fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": False,
        "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_sync_module_states": True, "fsdp_transformer_layer_cls_to_wrap": "Block", "fsdp_use_orig_params": True,
        "fsdp_version": 1, "fsdp_custom_key": 7,
    },
}


@pytest.mark.parametrize("config", [FSDP1_CONFIG, {**FSDP1_CONFIG, "fsdp_config": {"fsdp_version": 2, "fsdp_sharding_strategy": "FULL_SHARD"}},
                                    {"distributed_type": "NO"}], ids=["fsdp1", "already-fsdp2", "no-fsdp"])
def test_to_fsdp2_converts_as_accelerate_does(tmp_path, config):
    from accelerate.commands import to_fsdp2 as hf_to_fsdp2

    from accelerate_ref.commands import to_fsdp2 as ref_to_fsdp2

    assert ref_to_fsdp2.convert_config_to_fsdp2(copy.deepcopy(config)) == hf_to_fsdp2.convert_config_to_fsdp2(copy.deepcopy(config))
    source = _write(tmp_path / "fsdp1.yaml", config)
    for name, module in (("ours", ref_to_fsdp2), ("theirs", hf_to_fsdp2)):
        parser = module.to_fsdp2_command_parser()
        module.to_fsdp2_command(parser.parse_args(["--config_file", source, "--output_file", str(tmp_path / f"{name}.yaml")]))
    assert (tmp_path / "ours.yaml").read_text() == (tmp_path / "theirs.yaml").read_text()


def test_tpu_config_builds_the_gcloud_command_as_accelerate_does(tmp_path, capsys, monkeypatch):
    from accelerate.commands import tpu as hf_tpu

    from accelerate_ref.commands import tpu as ref_tpu

    config = _write(tmp_path / "tpu.yaml", {"distributed_type": "XLA", "tpu_name": "pod", "tpu_zone": "zone-a", "commands": ["echo a", "echo b"]})
    commands = tmp_path / "setup.sh"
    commands.write_text("pip list\nls\n")
    for argv in (["--config_file", config, "--debug"],
                 ["--config_file", config, "--debug", "--install_accelerate", "--accelerate_version", "1.15.0", "--use_alpha"],
                 ["--config_file", config, "--debug", "--command_file", str(commands), "--tpu_zone", "zone-b"]):
        printed = []
        for module in (ref_tpu, hf_tpu):
            module.tpu_command_launcher(module.tpu_command_parser().parse_args(argv))
            printed.append(capsys.readouterr().out)
        assert printed[0] == printed[1] and printed[0].startswith("Running gcloud"), argv


def test_custom_argument_parser_takes_both_spellings_and_records_given_flags():
    from accelerate.commands.utils import CustomArgumentParser as HFParser

    from accelerate_ref.commands.utils import CustomArgumentParser as RefParser

    results = []
    for cls in (RefParser, HFParser):
        parser = cls()
        parser.add_argument("--num_processes", type=int, default=1)
        group = parser.add_argument_group("group")
        group.add_argument("--use_cpu", action="store_true")
        group.add_argument("--main_process_ip", default=None)
        args = parser.parse_args(["--num-processes", "4", "--use-cpu"])
        results.append((vars(args).get("num_processes"), args.use_cpu, args.main_process_ip, sorted(args.nondefault)))
    assert results[0] == results[1] == (4, True, None, ["num_processes", "use_cpu"])


def test_merge_weights_merges_a_sharded_checkpoint_as_accelerate_does(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from accelerate_ref.commands.accelerate_cli import run

    weights = {"linear.weight": torch.arange(6.0).reshape(2, 3), "linear.bias": torch.ones(2)}
    dcp.save({"model": weights}, checkpoint_id=str(tmp_path / "sharded"), no_dist=True)
    assert run(["merge-weights", str(tmp_path / "sharded"), str(tmp_path / "ours")]) == 0
    from accelerate.utils import merge_fsdp_weights

    merge_fsdp_weights(str(tmp_path / "sharded"), str(tmp_path / "theirs"))
    ours, theirs = load_file(str(tmp_path / "ours" / "model.safetensors")), load_file(str(tmp_path / "theirs" / "model.safetensors"))
    assert ours.keys() == theirs.keys() == weights.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in weights)


@pytest.mark.parametrize("argv, words", [
    (["to-fsdp2", "--config_file", "/nonexistent.yaml", "--overwrite"], "not found"),
    (["merge-weights", "/nonexistent_dir", "/tmp/out_never_written"], "nonexistent_dir"),
    (["tpu-config", "--config_file", "CONFIG", "--debug"], "command"),
    (["config", "update", "--config_file", "/nonexistent.yaml"], "doesn't exist"),
])
def test_new_commands_fail_in_one_line(tmp_path, capsys, argv, words):
    from accelerate_ref.commands.accelerate_cli import run

    config = _write(tmp_path / "c.yaml", {"distributed_type": "XLA"})
    code = run([config if item == "CONFIG" else item for item in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and words in err, err


def test_config_update_rewrites_with_todays_defaults(tmp_path):
    from accelerate_ref.commands.accelerate_cli import run

    old = _write(tmp_path / "old.yaml", {"distributed_type": "MULTI_GPU", "fp16": True, "dynamo_backend": "INDUCTOR", "num_processes": 2})
    assert run(["config", "update", "--config_file", old]) == 0
    theirs = hf_config_args.load_config_from_file(old)
    assert theirs.mixed_precision == "fp16" and theirs.dynamo_config == {"dynamo_backend": "INDUCTOR"}
    assert "fp16" not in yaml.safe_load(open(old)) and "use_cpu" in yaml.safe_load(open(old))


# --- launch module: help formatter, torchrun and DeepSpeed launchers on 🤗 Accelerate's namespace ---


@pytest.mark.parametrize("argv", [["accelerate", "launch", "--help"], ["accelerate", "launch", "--multi_gpu", "--use_fsdp", "--help"],
                                  ["accelerate-launch", "--tpu", "--fp8-backend", "te", "--help"]])
def test_launch_help_formatter_shows_the_groups_accelerate_shows(monkeypatch, argv):
    import sys

    from accelerate.commands import launch as hf_launch_command

    from accelerate_ref.commands import launch as ref_launch_command

    monkeypatch.setattr(sys, "argv", argv)
    assert [ref_launch_command.clean_option(a) for a in argv] == [hf_launch_command.clean_option(a) for a in argv]
    helps = []
    for module in (ref_launch_command, hf_launch_command):
        parser = argparse.ArgumentParser("launch", formatter_class=module.CustomHelpFormatter)
        hardware = parser.add_argument_group("Hardware Selection Arguments")
        hardware.add_argument("--cpu", action="store_true", help="cpu ranks")
        hardware.add_argument("--multi_gpu", "--multi-gpu", action="store_true", help="gpu ranks")
        paradigm = parser.add_argument_group("Training Paradigm Arguments")
        paradigm.add_argument("--use_fsdp", action="store_true", help="fsdp")
        fsdp = parser.add_argument_group("FSDP Arguments")
        fsdp.add_argument("--fsdp_version", help="version")
        fsdp.add_argument("--fsdp_offload_params", help="offload")
        fp8 = parser.add_argument_group("FP8 Arguments")
        fp8.add_argument("--fp8_backend", help="backend")
        parser.add_argument("training_script")
        helps.append(parser.format_help())
    assert helps[0] == helps[1]


def _rank_probe(tmp_path) -> str:
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'ACCELERATE_MIXED_PRECISION', 'ACCELERATE_USE_DEEPSPEED', 'ACCELERATE_DEBUG_MODE']\n"
        "out = os.path.join(os.path.dirname(__file__), sys.argv[1] + os.environ['RANK'] + '.json')\n"
        "json.dump({k: os.environ.get(k) for k in keys} | {'args': sys.argv[2:]}, open(out, 'w'))\n"
    )
    return str(script)


def _validated_hf_namespace(argv: list[str]) -> argparse.Namespace:
    """🤗 Accelerate's launch namespace after its own validation (defaults filled in as its ``launch`` does)."""
    from accelerate.commands.launch import _validate_launch_command

    args, _, _ = _validate_launch_command(_hf_launch_args_with(argv))
    return args


def _hf_launch_args_with(argv: list[str]) -> argparse.Namespace:
    from accelerate.commands.launch import launch_command_parser

    return launch_command_parser().parse_args(argv)


@pytest.mark.slow
def test_multi_gpu_launcher_runs_the_ranks_accelerate_runs(tmp_path, monkeypatch):
    """Both launchers, on the same 🤗 Accelerate namespace (2 CPU ranks), give each rank the same environment."""
    from accelerate.commands import launch as hf_launch_command

    from accelerate_ref.commands import launch as ref_launch_command

    monkeypatch.setenv("HF_HOME", str(tmp_path / "no_config_here"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    probe = _rank_probe(tmp_path)
    for name, module in (("ours", ref_launch_command), ("theirs", hf_launch_command)):
        args = _validated_hf_namespace(["--multi_gpu", "--num_processes", "2", "--mixed_precision", "bf16", "--debug",
                                        "--main_process_port", str(ref_other.get_free_port()), probe, name, "--lr", "3"])
        module.multi_gpu_launcher(args)
    import json

    seen = {name: [json.load(open(tmp_path / f"{name}{rank}.json")) for rank in (0, 1)] for name in ("ours", "theirs")}
    assert seen["ours"] == seen["theirs"] and [r["WORLD_SIZE"] for r in seen["ours"]] == ["2", "2"]


def test_deepspeed_launcher_refuses_without_deepspeed_as_accelerate_does(monkeypatch):
    from accelerate.commands import launch as hf_launch_command

    from accelerate_ref.commands import launch as ref_launch_command

    monkeypatch.setattr(ref_launch_command, "is_deepspeed_available", lambda: False)
    monkeypatch.setattr(hf_launch_command, "is_deepspeed_available", lambda: False)
    for module in (ref_launch_command, hf_launch_command):
        with pytest.raises(ImportError, match="DeepSpeed"):
            module.deepspeed_launcher(argparse.Namespace())


@pytest.mark.slow
def test_deepspeed_launcher_runs_torchrun_ranks_with_the_deepspeed_environment(tmp_path, monkeypatch):
    from accelerate_ref.commands import launch as ref_launch_command

    monkeypatch.setattr(ref_launch_command, "is_deepspeed_available", lambda: True)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    probe = _rank_probe(tmp_path)
    args = _hf_launch_args_with(["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--zero_stage", "2",
                                 "--main_process_port", str(ref_other.get_free_port()), probe, "ds"])
    args.deepspeed_fields_from_accelerate_config = []
    ref_launch_command.deepspeed_launcher(args)
    import json

    ranks = [json.load(open(tmp_path / f"ds{rank}.json")) for rank in (0, 1)]
    assert [(r["RANK"], r["WORLD_SIZE"], r["ACCELERATE_USE_DEEPSPEED"]) for r in ranks] == [("0", "2", "true"), ("1", "2", "true")]


@pytest.mark.slow
def test_tpu_launcher_runs_the_main_function_as_accelerate_does(tmp_path):
    """Both launchers on the simulator's stand-in ``torch_xla`` (one device), in a child process so the
    stand-in does not leak into this one: same ``sys.argv``, same environment, same ``PrepareForLaunch`` marks."""
    import subprocess
    import sys

    from simulators.devices import world_settings

    (tmp_path / "train_tpu.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    print(json.dumps({'argv': sys.argv[1:], 'fork': os.environ.get('FORK_LAUNCHED'), 'debug': os.environ.get('ACCELERATE_DEBUG_MODE')}))\n"
    )
    code = (
        "import importlib, sys\n"
        "from accelerate.commands.launch import launch_command_parser\n"
        "module = importlib.import_module(sys.argv[1])\n"
        "args = launch_command_parser().parse_args(['--tpu', '--debug', '--mixed_precision', 'no', sys.argv[2], '--x', '1'])\n"
        "args.main_training_function = 'main'\n"
        "module.tpu_launcher(args)\n"
    )
    pythonpath = os.pathsep.join([*world_settings("xla").pythonpath, os.environ.get("PYTHONPATH", "")])
    outputs = []
    for module in ("accelerate_ref.commands.launch", "accelerate.commands.launch"):
        done = subprocess.run([sys.executable, "-c", code, module, str(tmp_path / "train_tpu.py")], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": pythonpath})
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(done.stdout.strip().splitlines()[-1])
    assert outputs[0] == outputs[1] == '{"argv": ["--x", "1"], "fork": "1", "debug": "true"}'


@pytest.mark.parametrize("module, names", [
    ("utils.constants", ["TORCH_LAUNCH_PARAMS", "DEEPSPEED_MULTINODE_LAUNCHERS", "ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION",
                         "SAGEMAKER_PARALLEL_EC2_INSTANCES", "SAGEMAKER_PYTHON_VERSION", "SAGEMAKER_PYTORCH_VERSION", "SAGEMAKER_TRANSFORMERS_VERSION"]),
    ("commands.config.cluster", ["DEEPSPEED_MULTINODE_LAUNCHERS", "DYNAMO_BACKENDS", "TORCH_DYNAMO_MODES"]),
    ("commands.config.sagemaker", ["DYNAMO_BACKENDS", "SAGEMAKER_PARALLEL_EC2_INSTANCES", "TORCH_DYNAMO_MODES"]),
    ("commands.launch", ["options_to_group", "DEEPSPEED_MULTINODE_LAUNCHERS", "TORCH_DYNAMO_MODES", "DYNAMO_BACKENDS"]),
    ("commands.to_fsdp2", ["ARGUMENT_VALUE_MAPPING"]),
    ("launchers", ["ELASTIC_LOG_LINE_PREFIX_TEMPLATE_PYTORCH_VERSION"]),
])
def test_launcher_constants_hold_accelerates_values(module, names):
    import importlib

    ours, theirs = importlib.import_module(f"accelerate_ref.{module}"), importlib.import_module(f"accelerate.{module}")
    assert {name: getattr(ours, name) for name in names} == {name: getattr(theirs, name) for name in names}


def test_tpu_config_fails_in_one_line_when_gcloud_fails(tmp_path, monkeypatch, capsys):
    """🤗 Accelerate prints success whatever gcloud returns; accelerate-ref says it failed (one line, exit 1)."""
    from accelerate_ref.commands.accelerate_cli import run

    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'gcloud: no account' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    code = run(["tpu-config", "--command", "ls", "--tpu_name", "pod", "--tpu_zone", "zone"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == "accelerate-ref tpu-config: error: gcloud exited with code 3; the pod was not set up"


def test_launch_refuses_a_sagemaker_config_in_one_line(tmp_path, capsys):
    from accelerate_ref.commands.accelerate_cli import run

    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    config = _write(tmp_path / "sm.yaml", SAGEMAKER)
    assert run(["launch", "--config_file", config, str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SageMaker" in err, err


hf_launch_command = pytest.importorskip("accelerate.commands.launch")


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
    for module in (hf_launch_command, hf_config_args):
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
    args = hf_launch_command.launch_command_parser().parse_args(argv)
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
    return _validated(ref_launch_command, argv, caplog), _validated(hf_launch_command, argv, caplog)


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
    monkeypatch.setattr(ref_launch_command, "is_bf16_available", lambda ignore_tpu=False: False)
    monkeypatch.setattr(hf_launch_command, "is_bf16_available", lambda ignore_tpu=False: False)
    ours, theirs = _both(["--config_file", configs["multi_gpu"], "--mixed_precision", "bf16", "train.py"], caplog)
    assert ours[:2] == ("raised", ValueError) and ours == theirs


def test_accelerate_refs_own_namespace_validates(configs):
    args = ref_launch_command.launch_command_parser().parse_args(["--config_file", configs["multi_gpu"], "train.py"])
    args, defaults, from_config = ref_launch_command._validate_launch_command(args)
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


#: The variables that carry FSDP and ParallelismConfig options to the ranks.
_PARADIGM_PREFIXES = ("FSDP_", "ACCELERATE_USE_FSDP", "PARALLELISM_CONFIG_", "ACCELERATE_USE_PARALLELISM_CONFIG")


def _paradigm_env(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name.startswith(_PARADIGM_PREFIXES)}


@pytest.mark.parametrize("fsdp_config, flags", [
    ({"fsdp_version": 2, "fsdp_reshard_after_forward": False, "offload_params": True, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
      "min_num_params": 64, "fsdp_state_dict_type": "SHARDED_STATE_DICT"}, []),
    ({"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP"}, ["--fsdp_activation_checkpointing", "true"]),
], ids=["fsdp2-config", "fsdp1-config-and-flag"])
def test_an_fsdp_config_reaches_the_ranks_as_from_hfs_launch(tmp_path, monkeypatch, fsdp_config, flags):
    """A config whose ``distributed_type`` is FSDP (its ``fsdp_config`` and ``parallelism_config``, flags first) gives
    the ranks the variables 🤗 Accelerate's ``prepare_multi_gpu_env`` gives them; no FSDP option was lost, as when
    the launch ran such a config as plain DDP (catalog launch.cli)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    parallelism = {"parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 2} if fsdp_config["fsdp_version"] == 2 else {}
    config = _write(tmp_path / "fsdp.yaml", {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "no",
                                             "num_processes": 2, "num_machines": 1, "use_cpu": False, "debug": False,
                                             "fsdp_config": fsdp_config, "parallelism_config": parallelism})
    argv = ["--config_file", config, *flags, "train.py"]
    ours = ref_launch_command.launch_command_parser().parse_args(argv)
    ref_launch_command._apply_config(ours)
    theirs, _, _ = hf_launch_command._validate_launch_command(hf_launch_command.launch_command_parser().parse_args(argv))
    theirs.main_process_port = 0
    expected = _paradigm_env(hf_launch.prepare_multi_gpu_env(theirs))
    assert ours.use_fsdp and expected["ACCELERATE_USE_FSDP"] == "true"
    assert _paradigm_env(ref_launch.launch_env(ours, base={})) == expected


def test_fsdp_cpu_ram_efficient_loading_without_sync_is_refused_as_in_hf(configs):
    argv = ["--config_file", configs["fsdp"], "train.py"]
    ours = ref_launch_command.launch_command_parser().parse_args(argv)
    ref_launch_command._apply_config(ours)
    theirs, _, _ = hf_launch_command._validate_launch_command(hf_launch_command.launch_command_parser().parse_args(argv))
    theirs.main_process_port = 0
    with pytest.raises(ValueError) as hf_error:
        hf_launch.prepare_multi_gpu_env(theirs)
    with pytest.raises(ValueError, match=str(hf_error.value).replace("`", ".")):
        ref_launch.launch_env(ours, base={})
