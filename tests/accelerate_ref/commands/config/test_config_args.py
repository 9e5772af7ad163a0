"""The config files and ``config`` subcommands beside 🤗 Accelerate 1.15's, where no file or a bad file is given:
the same exception types and words (unknown keys, no ``distributed_type``, a missing file), and the same printed
line when ``config default`` writes the default file. Catalog: launch.config_file, launch.config_location.
"""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from accelerate_ref.commands.config import config_args as ref_config_args
from accelerate_ref.commands.config import default as ref_default
from accelerate_ref.commands.config import update as ref_update
from accelerate_ref.commands.config.config_args import ConfigError

hf_config_args = pytest.importorskip("accelerate.commands.config.config_args")
import accelerate.commands.config.default as hf_default  # noqa: E402
import accelerate.commands.config.update as hf_update  # noqa: E402

BASE = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no", "use_cpu": False,
        "debug": False}


def _write(path, values) -> str:
    path.write_text(json.dumps(values) if str(path).endswith(".json") else yaml.safe_dump(values))
    return str(path)


def _raised(function, *args) -> tuple[type, str]:
    with pytest.raises(Exception) as caught:
        function(*args)
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@pytest.mark.parametrize("values", [{**BASE, "invalid_key": 1, "another_invalid_key": 2},
                                    {key: value for key, value in BASE.items() if key != "distributed_type"}],
                         ids=["unknown-keys", "no-distributed-type"])
def test_a_refused_file_is_hfs_value_error_in_hfs_words(tmp_path, values, suffix):
    path = _write(tmp_path / f"config{suffix}", values)
    ours = _raised(ref_config_args.load_config_from_file, path)
    assert ours == _raised(hf_config_args.load_config_from_file, path)
    assert ours[0] is ValueError


def test_no_file_at_all_is_hfs_file_not_found_error(tmp_path, monkeypatch):
    """No ``--config_file`` and no default file: the default path, opened, as in HF."""
    missing = str(tmp_path / "hf_home" / "accelerate" / "default_config.yaml")
    for module in (ref_config_args, hf_config_args):
        monkeypatch.setattr(module, "default_config_file", missing)
    ours = _raised(ref_config_args.load_config_from_file, None)
    assert ours == _raised(hf_config_args.load_config_from_file, None) and ours[0] is FileNotFoundError
    given = str(tmp_path / "given.yaml")
    assert _raised(ref_config_args.load_config_from_file, given) == _raised(hf_config_args.load_config_from_file, given)


def test_config_update_of_a_missing_file_is_hfs_value_error(tmp_path, monkeypatch):
    args = argparse.Namespace(config_file=str(tmp_path / "missing.yaml"))
    ours = _raised(ref_update.update_config, args)
    assert ours == _raised(hf_update.update_config, args) and ours[0] is ValueError


def test_config_update_without_any_file_says_so(tmp_path, monkeypatch):
    """HF fails with a TypeError (``Path(None)``); accelerate-ref names the missing default (DIFFERENTIAL.toml)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    with pytest.raises(ConfigError, match="no config file to update"):
        ref_update.update_config(argparse.Namespace(config_file=None))


def test_config_default_prints_hfs_line(tmp_path, capsys):
    for module in (ref_default, hf_default):
        args = argparse.Namespace(save_location=str(tmp_path / module.__name__.split(".")[0] / "default_config.yaml"),
                                  mixed_precision="no")
        module.default_config_command(args)
    ours, theirs = capsys.readouterr().out.splitlines()
    assert ours.replace("accelerate_ref", "accelerate") == theirs
