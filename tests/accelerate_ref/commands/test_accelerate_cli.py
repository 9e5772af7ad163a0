"""The ``accelerate-ref`` command line: bad input gives one line and exit 2, config round trips, prompts.

Most checks call ``main(argv)`` in this process (nothing is launched before
validation); the timeout check launches two ranks of a script that sleeps.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from simulators.fork_root import run_module
from accelerate_ref.commands.accelerate_cli import run as main
from accelerate_ref.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate_ref.commands.config.config_args import current_default_config_file as default_config_file


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    return home


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('ran')\n")
    return str(path)


def one_line_error(capsys, argv: list[str], expected_code: int = 2) -> str:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == expected_code, err
    assert len(err.splitlines()) == 1, err
    return err


def test_unknown_flag(capsys, hf_home, script):
    assert "--bogus" in one_line_error(capsys, ["launch", "--bogus", script])


def test_missing_script_and_module(capsys, hf_home, tmp_path):
    assert "not found" in one_line_error(capsys, ["launch", str(tmp_path / "absent.py")])
    assert "not found" in one_line_error(capsys, ["launch", "-m", "no_such_module_xyz"])


@pytest.mark.parametrize(
    "content, words",
    [("num_processes: [unclosed\n", "not valid YAML"), ("- a\n- b\n", "mapping"),
     ("distributed_type: NO\nmixed_precision: bf16\nfancy_key: 1\n", "fancy_key"), ("mixed_precision: bf16\n", "distributed_type")],
)
def test_bad_config_file(capsys, hf_home, script, tmp_path, content, words):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    assert words in one_line_error(capsys, ["launch", "--config_file", str(config), script])


def test_machine_rank_out_of_range(capsys, hf_home, script):
    argv = ["launch", "-n", "4", "--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "127.0.0.1", "--main_process_port", "29999", script]
    assert "machine_rank" in one_line_error(capsys, argv)


def test_several_machines_need_an_address_unless_simulated(capsys, hf_home, script):
    assert "--main_process_ip" in one_line_error(capsys, ["launch", "-n", "2", "--num_machines", "2", script])
    # --simulate puts every machine on this host: the dry run starts (2 ranks as 2 machines) without one.
    assert main(["launch", "--simulate", "cpu", "-n", "2", "--num_machines", "2", script]) == 0
    assert "2 ranks as 2 machine(s), ok" in capsys.readouterr().out


def test_port_in_use(capsys, hf_home, script):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert "in use" in one_line_error(capsys, ["launch", "--cpu", "-n", "2", "--main_process_port", str(port), script])


def test_config_location_rules(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "a"))
    assert default_config_file() == str(tmp_path / "a" / "accelerate" / "default_config.yaml")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_config_file() == str(tmp_path / "x" / "huggingface" / "accelerate" / "default_config.yaml")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert default_config_file() == str(tmp_path / "h" / ".cache" / "huggingface" / "accelerate" / "default_config.yaml")


def test_config_default_writes_once(capsys, hf_home):
    assert main(["config", "default", "--mixed_precision", "bf16"]) == 0
    written = yaml.safe_load(open(default_config_file()))
    assert written["mixed_precision"] == "bf16" and written["compute_environment"] == "LOCAL_MACHINE"
    assert main(["config", "default", "--mixed_precision", "fp16"]) == 0
    assert yaml.safe_load(open(default_config_file()))["mixed_precision"] == "bf16"
    assert "will not override" in capsys.readouterr().out


def test_interactive_config_from_stdin(hf_home, tmp_path):
    path = tmp_path / "asked.yaml"
    answers = "multi-cpu\n2\n1\n127.0.0.1\n29555\nyes\n4\nbf16\n"
    done = subprocess.run([sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "config", "--config_file", str(path)],
                          input=answers, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    config = load_config_from_file(str(path))
    assert (config.distributed_type, config.num_machines, config.machine_rank, config.main_process_port) == ("MULTI_CPU", 2, 1, 29555)
    assert (config.use_cpu, config.num_processes, config.mixed_precision) == (True, 4, "bf16")


def test_interactive_config_bad_answer(hf_home, tmp_path):
    done = subprocess.run([sys.executable, "-m", "accelerate_ref.commands.accelerate_cli", "config", "--config_file", str(tmp_path / "c.yaml")],
                          input="quantum\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_hf_written_config_round_trip(tmp_path):
    values = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "mixed_precision": "fp16",
              "num_processes": 8, "gpu_ids": "all", "downcast_bf16": "no", "tpu_env": [], "dynamo_config": {"dynamo_backend": "INDUCTOR"}}
    path = tmp_path / "hf.yaml"
    path.write_text(yaml.safe_dump(values))
    config = ClusterConfig.from_yaml_file(str(path))
    config.to_yaml_file(str(tmp_path / "out.yaml"))
    again = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert {k: again[k] for k in ("distributed_type", "mixed_precision", "num_processes", "gpu_ids", "dynamo_config")} == {
        k: values[k] for k in ("distributed_type", "mixed_precision", "num_processes", "gpu_ids", "dynamo_config")}


def test_env_prints_versions_and_config(capsys, hf_home):
    main(["config", "default"])
    capsys.readouterr()
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "PyTorch version" in out and "Active config:" in out and "mixed_precision: no" in out


def test_hang_past_timeout_stops_every_rank(tmp_path, hf_home):
    pids = tmp_path / "pids"
    pids.mkdir()
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text(f"import os, time\nopen(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\ntime.sleep(300)\n")
    started = time.monotonic()
    done = run_module("accelerate_ref.commands.accelerate_cli", "launch", "--cpu", "-n", "2", "--timeout", "8",
                      str(sleeper), timeout=200)
    assert done.returncode == 1, done.stderr
    assert "--timeout" in done.stderr.strip().splitlines()[-1]
    assert time.monotonic() - started < 150
    time.sleep(1)
    started_pids = [int(name) for name in os.listdir(pids)]
    assert len(started_pids) == 2
    assert [pid for pid in started_pids if os.path.exists(f"/proc/{pid}")] == []
