"""``accelerate-ref launch``'s parser beside 🤗 Accelerate 1.15's: the same options in the same groups with the same
defaults, both spellings of each, ``launch -h`` listing each option once, ``_validate_launch_command`` on its own
parser's namespace as HF's test suite calls it, and the refusals HF's launch makes, in HF's types and words.

Catalog: launch.cli, launch.config_file.
"""

from __future__ import annotations

import argparse
import sys

import pytest
import yaml

from accelerate_ref.commands import launch as ref_launch
from accelerate_ref.commands.accelerate_cli import build_parser, run
from accelerate_ref.commands._launch.options import OWN_GROUP

hf_launch = pytest.importorskip("accelerate.commands.launch")


def _groups(parser: argparse.ArgumentParser) -> dict[str, dict[str, tuple]]:
    """Each group's options: (dest, first option string) -> (option strings, default, choices, nargs, const)."""
    return {group.title: {(action.dest, action.option_strings[0] if action.option_strings else ""):
                          (sorted(action.option_strings), repr(action.default), action.choices, action.nargs, action.const)
                          for action in group._group_actions}
            for group in parser._action_groups}


def _launch_subparser() -> argparse.ArgumentParser:
    """The ``launch`` parser as the ``accelerate-ref`` console script builds it."""
    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices["launch"]


@pytest.mark.parametrize("make", [ref_launch.launch_command_parser, _launch_subparser], ids=["standalone", "console-script"])
def test_options_groups_and_defaults_are_hfs_plus_its_own_group(make):
    ours, theirs = _groups(make()), _groups(hf_launch.launch_command_parser())
    own = ours.pop(OWN_GROUP[0])
    assert ours == theirs
    assert {dest for dest, _ in own} == {"num_processes", "timeout", "simulate", "device_memory", "gpu", "summary_json",
                                         "no_compute", "steps", "heaviest_batches", "fit", "report", "memory_snapshot"}


@pytest.mark.parametrize("argv", [
    ["--config-file", "test.yaml", "test.py"],
    ["--multi-gpu", "--num-processes", "4", "test.py"],
    ["--multi-gpu", "--use-deepspeed", "--use-fsdp", "--num_processes", "4", "test.py"],
    ["--multi_gpu", "--use_deepspeed", "--use_fsdp", "--num-processes", "4", "test.py"],
    ["--main-process-port", "29501", "--main_process_ip", "10.0.0.1", "--monitor-interval", "0.5", "--no-python", "x"],
    ["--fsdp-sync-module-states", "false", "--tpu-cluster", "--no-tpu-cluster", "-t", "3", "test.py", "--lr", "1"],
    ["--deepspeed_config_file", "path/to/be/accepted", "--zero-stage", "3", "test.py"],
], ids=["config-file", "hyphens", "mixed-hyphens", "mixed-underscores", "ports", "fsdp-tpu-tee", "deepspeed"])
def test_either_spelling_parses_as_in_hf(argv):
    ours = vars(ref_launch.launch_command_parser().parse_args(argv))
    theirs = vars(hf_launch.launch_command_parser().parse_args(argv))
    own = {dest for (dest, option) in _groups(ref_launch.launch_command_parser())[OWN_GROUP[0]] if option != "-n"}
    assert {name: value for name, value in ours.items() if name not in own} == theirs


def test_store_true_flags_of_the_parser_itself_default_to_none_as_in_hf():
    args = ref_launch.launch_command_parser().parse_args(["test.py"])
    assert (args.debug, args.module, args.no_python, args.quiet) == (None, None, None, None)
    assert (args.cpu, args.use_fsdp, args.fsdp_sync_module_states, args.fsdp_version) == (False, False, "true", "1")


def _help(parser: argparse.ArgumentParser, monkeypatch, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", ["accelerate", "launch", *argv])
    return parser.format_help()


@pytest.mark.parametrize("make", [ref_launch.launch_command_parser, _launch_subparser], ids=["standalone", "console-script"])
def test_help_lists_each_option_under_its_underscore_spelling_once(make, monkeypatch):
    """HF's ``test_duplicate_entities``: no hyphen spelling of a destination in ``launch -h`` (``--num-processes``
    once, in the description); ``--config_file`` listed once (it was listed under both spellings)."""
    text = _help(make(), monkeypatch, "-h")
    for dest in vars(make().parse_args(["test.py"])):
        hyphenated = f"--{dest.replace('_', '-')}"
        if "_" in dest:
            assert text.count(hyphenated) == (1 if hyphenated == "--num-processes" else 0), hyphenated
    assert text.count("--config_file CONFIG_FILE") == 2  # the usage line and the options list
    assert "--config-file" not in text


def test_help_shows_the_groups_hf_shows_and_its_own(monkeypatch):
    """With a paradigm flag given, ``launch -h`` shows the groups HF shows for it, and accelerate-ref's group."""
    ours = _help(ref_launch.launch_command_parser(), monkeypatch, "--use_fsdp", "-h")
    theirs = _help(hf_launch.launch_command_parser(), monkeypatch, "--use_fsdp", "-h")
    titles = [line for line in theirs.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert [line for line in ours.splitlines() if line in titles or line == f"{OWN_GROUP[0]}:"] == titles + [f"{OWN_GROUP[0]}:"]


def test_validate_launch_command_on_its_own_parser_as_hfs_test(tmp_path, monkeypatch):
    """HF's ``test_validate_launch_command``, switched: flags given win over the config, the rest come from it."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    config = tmp_path / "validate_launch_cmd.yaml"
    config.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "debug": True, "num_processes": 1,
                                      "distributed_type": "NO", "fsdp_config": {"fsdp_sync_module_states": False},
                                      "deepspeed_config": {"deepspeed_config_file": "path/to/be/ignored"}}))
    argv = ["--num-processes", "2", "--deepspeed_config_file", "path/to/be/accepted", "--config-file", str(config), "test.py"]
    args = ref_launch.launch_command_parser().parse_args(argv)
    assert not args.debug and args.fsdp_sync_module_states
    ref_launch._validate_launch_command(args)
    assert args.debug and args.num_processes == 2 and not args.fsdp_sync_module_states
    assert args.deepspeed_config_file == "path/to/be/accepted"


def _config(tmp_path, name: str, values: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_launch_command_raises_hfs_errors_for_a_bad_config(tmp_path, monkeypatch):
    """HF's ``test_invalid_keys``: unknown keys are a ValueError from the launch; a missing file HF's FileNotFoundError."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    script = tmp_path / "test.py"
    script.write_text("")
    bad = _config(tmp_path, "invalid_keys.yaml", {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO",
                                                  "mixed_precision": "no", "use_cpu": False, "debug": False,
                                                  "invalid_key": 1, "another_invalid_key": 2})
    for module in (ref_launch, hf_launch):
        args = module.launch_command_parser().parse_args(["--config_file", bad, str(script)])
        with pytest.raises(ValueError, match=r"had unknown keys \(\['another_invalid_key', 'invalid_key'\]\), please try"):
            module.launch_command(args)
    missing = str(tmp_path / "missing.yaml")
    with pytest.raises(FileNotFoundError) as theirs:
        hf_launch.launch_command(hf_launch.launch_command_parser().parse_args(["--config_file", missing, str(script)]))
    with pytest.raises(FileNotFoundError) as ours:
        ref_launch.launch_command(ref_launch.launch_command_parser().parse_args(["--config_file", missing, str(script)]))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("flag, words", [
    (["--use-megatron-lm"], "--use_megatron_lm asks for a Megatron-LM launch"),
    (["--tpu_cluster"], "--tpu_cluster asks for a TPU pod launch"),
    (["--mpirun_hostfile", "hosts"], "--mpirun_hostfile asks for an mpirun launch"),
])
def test_hf_launchers_it_lacks_are_refused_in_one_line(tmp_path, capsys, flag, words):
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    assert run(["launch", *flag, str(script)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"accelerate-ref launch: error: {words}") and len(err.splitlines()) == 1


def test_hf_torchrun_options_reach_torchrun(tmp_path, monkeypatch):
    """``--max_restarts``, ``--monitor_interval``, ``--role`` ... are torchrun's own options under the same names."""
    args = ref_launch.launch_command_parser().parse_args(["--max-restarts", "2", "--monitor_interval", "0.5",
                                                           "--role", "trainer", "--rdzv-conf", "a=1", "train.py"])
    torchrun = ref_launch._torchrun_namespace(args)
    assert (torchrun.max_restarts, torchrun.monitor_interval, torchrun.role, torchrun.rdzv_conf) == (2, 0.5, "trainer", "a=1")
