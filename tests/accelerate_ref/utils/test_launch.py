"""``accelerate_ref.utils.launch``'s MPI launcher helpers beside 🤗 Accelerate 1.15's, on HF's launch namespace.

HF's tests patch ``accelerate.utils.launch.which`` and ``accelerate.utils.launch.subprocess.check_output`` to
pretend an MPI install: the same patches must reach the reference's helpers through the same names.
"""

from __future__ import annotations

import argparse
from unittest import mock

import accelerate.utils.launch as hf_launch
import pytest

import accelerate_ref.utils.launch as ref_launch

#: What ``<app> --version`` prints, by MPI flavour.
VERSIONS = {"intel": b"Intel(R) MPI Library for Linux* OS, Version 2021.10", "openmpi": b"mpirun (Open MPI) 4.1.5"}


@pytest.fixture
def hf_namespace(tmp_path, monkeypatch):
    """HF's launch namespace for ``argv`` after HF's validation (no config file read: ``--cpu``)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    def build(*flags: str) -> argparse.Namespace:
        args = launch_command_parser().parse_args(["--cpu", *flags, "train.py", "--lr", "1"])
        return _validate_launch_command(args)[0]

    return build


def _run_with_mpi(module, function, *args, found=("mpirun", "mpiexec"), flavour="intel"):
    """``module.function(*args)`` with ``which`` finding ``found`` and ``--version`` printing ``flavour``'s text,
    patched in ``module`` as HF's tests patch them; the value, or the exception's type and text."""
    version = mock.Mock(return_value=VERSIONS[flavour])
    with (mock.patch.object(module, "which", side_effect=lambda app: f"/usr/bin/{app}" if app in found else None),
          mock.patch.object(module.subprocess, "check_output", version)):
        try:
            value = getattr(module, function)(*args)
        except OSError as error:
            return type(error).__name__, str(error)
    return value, [call.args[0] for call in version.call_args_list]


@pytest.mark.parametrize("found", [("mpirun", "mpiexec"), ("mpiexec",), ()])
@pytest.mark.parametrize("flavour", sorted(VERSIONS))
def test_get_mpirun_args_finds_the_launcher_through_which_as_hf(found, flavour):
    ours = _run_with_mpi(ref_launch, "_get_mpirun_args", found=found, flavour=flavour)
    assert ours == _run_with_mpi(hf_launch, "_get_mpirun_args", found=found, flavour=flavour)
    if found:
        assert ours[0][0] == found[0] and ours[1] == [[found[0], "--version"]]


@pytest.mark.parametrize("flags", [
    ["--mpirun_hostfile", "/home/user/hostfile", "--num_processes", "16", "--num_machines", "4",
     "--main_process_ip", "127.0.0.1", "--main_process_port", "29500"],  # HF's test_mpi_multicpu_config_cmd
    ["--mpirun_hostfile", "/home/user/hostfile"],
    [],
], ids=["hf_test_config", "hostfile_only", "no_hostfile"])
@pytest.mark.parametrize("flavour", sorted(VERSIONS))
def test_a_simple_launch_with_a_hostfile_starts_with_hfs_mpirun_command(hf_namespace, flags, flavour):
    ours = _run_with_mpi(ref_launch, "prepare_simple_launcher_cmd_env", hf_namespace(*flags), flavour=flavour)
    theirs = _run_with_mpi(hf_launch, "prepare_simple_launcher_cmd_env", hf_namespace(*flags), flavour=flavour)
    (our_cmd, _), _ = ours
    (their_cmd, _), _ = theirs
    assert our_cmd == their_cmd
    if flags and flags[-1] == "29500" and flavour == "intel":
        assert our_cmd[:7] == ["mpirun", "-f", "/home/user/hostfile", "-ppn", "4", "-n", "16"]


def test_no_mpi_installed_is_hfs_oserror(hf_namespace):
    args = hf_namespace("--mpirun_hostfile", "/home/user/hostfile")
    ours = _run_with_mpi(ref_launch, "prepare_simple_launcher_cmd_env", args, found=())
    assert ours == _run_with_mpi(hf_launch, "prepare_simple_launcher_cmd_env", args, found=())
    assert ours[0] == "OSError"
