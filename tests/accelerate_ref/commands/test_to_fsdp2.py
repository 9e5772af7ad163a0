"""``accelerate-ref to-fsdp2`` beside 🤗 Accelerate 1.15's: its refusals (types, words, order, and existence asked of
``pathlib.Path.exists`` as HF's own tests patch it) and its warnings. Catalog: launch.config_file.
"""

from __future__ import annotations

import logging
from unittest.mock import patch

import pytest
import yaml

from accelerate_ref.commands import to_fsdp2 as ref_to_fsdp2

hf_to_fsdp2 = pytest.importorskip("accelerate.commands.to_fsdp2")

FSDP1 = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "no", "use_cpu": False,
         "debug": False, "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "FULL_SHARD"}}


def _raised(module, argv: list[str]) -> tuple[type, str]:
    args = module.to_fsdp2_command_parser().parse_args(argv)
    with pytest.raises(Exception) as caught:
        module.to_fsdp2_command(args)
    return type(caught.value), str(caught.value)


def test_an_existing_output_without_overwrite_is_hfs_file_exists_error(tmp_path):
    config, output = tmp_path / "fsdp1.yaml", tmp_path / "out.yaml"
    config.write_text(yaml.safe_dump(FSDP1))
    output.write_text("kept: true\n")
    argv = ["--config_file", str(config), "--output_file", str(output)]
    ours = _raised(ref_to_fsdp2, argv)
    assert ours == _raised(hf_to_fsdp2, argv)
    assert ours == (FileExistsError, f"Output file {output} already exists and --overwrite is not set")
    assert output.read_text() == "kept: true\n"


def test_existence_is_asked_of_pathlib_as_hfs_test_patches_it(tmp_path, monkeypatch):
    """HF's ``test_overwrite_when_output_file_exists`` patches ``pathlib.Path.exists`` to say yes."""
    config = tmp_path / "fsdp1.yaml"
    config.write_text(yaml.safe_dump(FSDP1))
    monkeypatch.chdir(tmp_path)
    argv = ["--config_file", str(config), "--output_file", "output.yaml"]
    with patch("pathlib.Path.exists", return_value=True):
        ours, theirs = _raised(ref_to_fsdp2, argv), _raised(hf_to_fsdp2, argv)
    assert ours == theirs == (FileExistsError, "Output file output.yaml already exists and --overwrite is not set")
    assert not (tmp_path / "output.yaml").exists()


@pytest.mark.parametrize("argv", [["--config_file", "missing.yaml", "--output_file", "out.yaml"],
                                  ["--config_file", "fsdp1.yaml"]], ids=["missing-config", "no-output"])
def test_the_other_refusals_are_hfs(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fsdp1.yaml").write_text(yaml.safe_dump(FSDP1))
    assert _raised(ref_to_fsdp2, argv) == _raised(hf_to_fsdp2, argv)


def test_a_config_already_at_fsdp2_logs_hfs_two_warnings(tmp_path, caplog):
    config = tmp_path / "fsdp2.yaml"
    config.write_text(yaml.safe_dump({**FSDP1, "fsdp_config": {"fsdp_version": 2}}))
    messages = []
    for module in (ref_to_fsdp2, hf_to_fsdp2):
        caplog.clear()
        args = module.to_fsdp2_command_parser().parse_args(["--config_file", str(config), "--output_file",
                                                            str(tmp_path / f"{module.__name__}.yaml")])
        with caplog.at_level(logging.WARNING, logger=module.__name__):
            module.to_fsdp2_command(args)
        messages.append([record.getMessage() for record in caplog.records if record.name == module.__name__])
    assert messages[0] == messages[1] and len(messages[0]) == 2
