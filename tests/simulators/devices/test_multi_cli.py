"""The simulated machine's environment contract and how runs ask for it.

``simulators.devices.families.machine`` parses it; ``python -m conformance run
--device-count/--device-memory`` and ``python -m simulators launch --device
npu --device-count/--device-memory`` hand it to every rank, and refuse it in
one line where there are no mock accelerators.
"""
from __future__ import annotations

import textwrap

import pytest

from conformance.__main__ import main as conformance_main
from conformance.engine.backends import make_backend, mock_device
from simulators.__main__ import main as simulators_main
from simulators.devices.families import machine

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "text, size",
    [("67108864", 64 * 2**20), ("64MB", 64 * 10**6), ("500MiB", 500 * 2**20), ("1.5GB", 1_500_000_000), ("2 kib", 2048)],
)
def test_sizes_read_as_accelerate_max_memory_strings(text, size):
    assert machine.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "64XB", "MB", "-1MB", "0", "1e3"])
def test_a_size_that_does_not_parse_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="is not a memory size"):
        machine.parse_size(text)


def test_the_environment_is_read_when_queried(monkeypatch):
    monkeypatch.delenv("SIMULATORS_NPU_DEVICE_COUNT", raising=False)
    monkeypatch.delenv("SIMULATORS_DEVICE_MEMORY", raising=False)
    assert machine.device_count("npu", default=3) == 3 and machine.device_memory() is None
    monkeypatch.setenv("SIMULATORS_NPU_DEVICE_COUNT", "4")
    monkeypatch.setenv("SIMULATORS_DEVICE_MEMORY", "64MB")
    assert machine.device_count("npu", default=3) == 4 and machine.device_memory() == 64 * 10**6
    assert machine.device_count("xla", default=1) == 1, "each family has its own count"
    monkeypatch.setenv("SIMULATORS_DEVICE_MEMORY", "lots")
    with pytest.raises(ValueError, match="SIMULATORS_DEVICE_MEMORY: 'lots' is not a memory size"):
        machine.device_memory()


def test_machine_env_names_the_bad_option():
    assert machine.machine_env("npu", "4", "64MB") == {
        "SIMULATORS_NPU_DEVICE_COUNT": "4", "SIMULATORS_DEVICE_MEMORY": "64MB",
    }
    assert machine.machine_env("xla", 2) == {"SIMULATORS_XLA_DEVICE_COUNT": "2"}
    with pytest.raises(ValueError, match="--device-count: 'four'"):
        machine.machine_env("npu", "four")
    with pytest.raises(ValueError, match="--device-memory: '64 bananas'"):
        machine.machine_env("npu", None, "64 bananas")


def test_conformance_run_refuses_machine_options_without_mock_accelerators(capsys):
    assert conformance_main(["run", "--backend", "sim", "--device-count", "4"]) == 2
    assert conformance_main(["run", "--backend", "sim-npu", "--device-memory", "big"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "conformance: backend sim has no mock accelerators; --device-count and --device-memory need sim-npu or sim-xla",
        "conformance: --device-memory: 'big' is not a memory size: give bytes or a number with one of KB, MB, GB, TB "
        "(powers of 10) or KiB, MiB, GiB, TiB (powers of 2)",
    ]


def test_the_device_backends_hand_the_machine_to_their_ranks():
    assert [mock_device(name) for name in ("sim", "sim-npu", "sim-xla", "native")] == [None, "npu", "xla", None]
    wanted = {"SIMULATORS_NPU_DEVICE_COUNT": "4"}
    backend = make_backend("sim-npu", "accelerate_ref", 5.0, machine=wanted)
    try:
        assert backend.machine == wanted
    finally:
        backend.close()
    for name in ("sim", "native"):
        with pytest.raises(ValueError, match="--device-count and --device-memory need sim-npu or sim-xla"):
            make_backend(name, "accelerate_ref", 5.0, machine=wanted)


def test_launch_gives_every_rank_its_own_budgeted_npus(tmp_path, capfd):
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch
        import torch_npu
        held = torch.zeros(1000, device="npu:3")
        print("rank", os.environ["RANK"], torch.npu.device_count(), torch.npu.mem_get_info(3), flush=True)
    """))
    argv = ["launch", "-n", "2", "--timeout", "60", "--device", "npu", "--device-count", "4", "--device-memory", "1MiB"]
    assert simulators_main([*argv, str(script)]) == 0
    out = capfd.readouterr().out
    for rank in (0, 1):
        assert f"rank {rank} 4 ({2**20 - 4000}, {2**20})" in out, "each rank holds only its own tensor"


def test_launch_refuses_machine_options_without_a_device(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        simulators_main(["launch", "-n", "1", "--device-count", "2", str(tmp_path / "x.py")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "simulators: error: --device-count and --device-memory need --device npu or --device xla"
    )
