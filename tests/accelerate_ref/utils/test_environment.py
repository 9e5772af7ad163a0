"""Catalog: env.patch_environment, env.clear_environment."""

import os

import accelerate.utils as hf_utils  # noqa: E402
import pytest
import torch

import accelerate_ref.utils as ref_utils  # noqa: E402
from accelerate_ref.utils import (
    clear_environment,
    convert_dict_to_env_variables,
    get_cpu_distributed_information,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)


@pytest.mark.parametrize("value", ["1", "y", "YES", "true", "On", "t"])
def test_str_to_bool_true(value):
    assert str_to_bool(value) == 1


@pytest.mark.parametrize("value", ["0", "n", "No", "FALSE", "off", "f"])
def test_str_to_bool_false(value):
    assert str_to_bool(value) == 0


def test_str_to_bool_rejects_other_values():
    """HF 1.15's words, with the lower-cased value; surrounding spaces are not stripped."""
    with pytest.raises(ValueError, match="^invalid truth value maybe$"):
        str_to_bool("Maybe")
    with pytest.raises(ValueError, match="^invalid truth value  t $"):
        str_to_bool(" t ")


def test_parse_flag_from_env(monkeypatch):
    monkeypatch.delenv("ACCELERATE_REF_TEST_FLAG", raising=False)
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG") is False
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG", default=True) is True
    monkeypatch.setenv("ACCELERATE_REF_TEST_FLAG", "yes")
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG") is True
    monkeypatch.setenv("ACCELERATE_REF_TEST_FLAG", "0")
    assert parse_flag_from_env("ACCELERATE_REF_TEST_FLAG", default=True) is False
    monkeypatch.setenv("ACCELERATE_REF_TEST_FLAG", "sometimes")
    with pytest.raises(ValueError):
        parse_flag_from_env("ACCELERATE_REF_TEST_FLAG")


def test_get_int_from_env(monkeypatch):
    monkeypatch.setenv("ACCELERATE_REF_A", "-1")
    monkeypatch.setenv("ACCELERATE_REF_B", "3")
    monkeypatch.delenv("ACCELERATE_REF_C", raising=False)
    assert get_int_from_env(["ACCELERATE_REF_C", "ACCELERATE_REF_A", "ACCELERATE_REF_B"], 7) == 3
    assert get_int_from_env(["ACCELERATE_REF_C", "ACCELERATE_REF_A"], 7) == 7


def test_patch_environment_doc_example(monkeypatch):
    """env.patch_environment: the documented example, keys upper-cased, values str()."""
    monkeypatch.delenv("FOO", raising=False)
    monkeypatch.delenv("ACCELERATE_REF_NUM", raising=False)
    with patch_environment(FOO="bar", accelerate_ref_num=2):
        assert os.environ["FOO"] == "bar"
        assert os.environ["ACCELERATE_REF_NUM"] == "2"
        assert "accelerate_ref_num" not in os.environ
    assert "FOO" not in os.environ
    assert "ACCELERATE_REF_NUM" not in os.environ


def test_patch_environment_restores_previous_value_even_on_error(monkeypatch):
    monkeypatch.setenv("FOO", "before")
    with pytest.raises(RuntimeError):
        with patch_environment(FOO="inside"):
            assert os.environ["FOO"] == "inside"
            raise RuntimeError("boom")
    assert os.environ["FOO"] == "before"


def test_clear_environment_doc_example(monkeypatch):
    """env.clear_environment: empty inside, old environment back, changes discarded."""
    monkeypatch.setenv("FOO", "bar")
    before = dict(os.environ)
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["FOO"] = "new_bar"
        os.environ["ACCELERATE_REF_ONLY_INSIDE"] = "1"
        assert os.environ["FOO"] == "new_bar"
    assert os.environ["FOO"] == "bar"
    assert dict(os.environ) == before


def test_clear_environment_restores_on_error(monkeypatch):
    monkeypatch.setenv("FOO", "bar")
    with pytest.raises(KeyError):
        with clear_environment():
            os.environ["FOO"]
    assert os.environ["FOO"] == "bar"


_SMI_ANSWERS = {
    "two RTX 4090, old driver": ("2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090\n", "535.86.10\n"),
    "two RTX 4090, fixed driver": ("2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090\n", "550.54.14\n550.54.14\n"),
    "one RTX 4090, old driver": ("1, NVIDIA GeForce RTX 4090\n", "535.86.10\n"),
    "two H100, old driver": ("2, NVIDIA H100 80GB HBM3\n2, NVIDIA H100 80GB HBM3\n", "535.86.10\n"),
}


@pytest.mark.parametrize("machine", list(_SMI_ANSWERS))
def test_nvidia_smi_helpers_match_hf(machine: str, monkeypatch) -> None:
    import subprocess

    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    names, driver = _SMI_ANSWERS[machine]

    def fake_check_output(command, universal_newlines=False):
        assert command[0] == "nvidia-smi" and universal_newlines
        return names if command[1] == "--query-gpu=count,name" else driver

    monkeypatch.setattr(subprocess, "check_output", fake_check_output)
    answers = [(env.get_gpu_info(), env.get_driver_version(), env.check_cuda_p2p_ib_support()) for env in (ref_env, hf_env)]
    assert answers[0] == answers[1]
    assert answers[0][2] is (machine != "two RTX 4090, old driver")


def test_p2p_check_says_supported_when_nvidia_smi_fails(monkeypatch) -> None:
    import subprocess

    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "check_output", missing)
    assert ref_env.check_cuda_p2p_ib_support() is hf_env.check_cuda_p2p_ib_support() is True
    with pytest.raises(FileNotFoundError):
        ref_env.get_gpu_info()


@pytest.mark.parametrize("cuda", [False, True])
def test_numa_affinity_matches_hf(cuda: bool, fake_nvml_gpu, monkeypatch) -> None:
    """With CUDA (NVML faked: GPU 0 near CPUs 1, 3 and 65) both pin the same CPUs; without it neither pins."""
    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for env in (ref_env, hf_env):
        env.override_numa_affinity(0, verbose=False)
    assert fake_nvml_gpu == ([[1, 3, 65], [1, 3, 65]] if cuda else [])
    if cuda:  # set_numa_affinity pins once per arguments (cached), as HF's
        for env in (ref_env, hf_env):
            env.set_numa_affinity(7, verbose=False)
            env.set_numa_affinity(7, verbose=False)
        assert len(fake_nvml_gpu) == 4


def test_numa_affinity_without_pynvml_is_hfs_import_error(fake_nvml_gpu, monkeypatch) -> None:
    from accelerate.utils import environment as hf_env

    from accelerate_ref.utils import environment as ref_env

    for module in (hf_utils, ref_utils.imports):
        monkeypatch.setattr(module, "is_pynvml_available", lambda: False)
    errors = []
    for env in (ref_env, hf_env):
        with pytest.raises(ImportError) as error:
            env.override_numa_affinity(0, verbose=False)
        errors.append(str(error.value))
    assert errors[0] == errors[1] and "nvidia-ml-py" in errors[0] and not fake_nvml_gpu


def test_is_pynvml_available_matches_hf() -> None:
    assert ref_utils.is_pynvml_available() == hf_utils.is_pynvml_available()


def test_env_helpers(monkeypatch) -> None:
    assert convert_dict_to_env_variables({"A": "1", "B": "x;rm", "C": "", "D": "2"}) == ["A=1\n", "D=2\n"]
    monkeypatch.setenv("CHOICE", "fp16")
    assert parse_choice_from_env("CHOICE") == "fp16" and parse_choice_from_env("UNSET_CHOICE_X", 3) == "3"
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "4")
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    info = get_cpu_distributed_information()
    assert (info.rank, info.world_size) == (2, 4)


def test_purge_accelerate_environment_restores_and_removes(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATE_KEPT", "before")

    @purge_accelerate_environment
    def sets_variables() -> None:
        os.environ["ACCELERATE_KEPT"] = "changed"
        os.environ["ACCELERATE_NEW"] = "1"
        raise RuntimeError("even when it raises")

    with pytest.raises(RuntimeError):
        sets_variables()
    assert os.environ["ACCELERATE_KEPT"] == "before" and "ACCELERATE_NEW" not in os.environ

    @purge_accelerate_environment
    class Base:
        def test_one(self) -> None:
            os.environ["ACCELERATE_FROM_BASE"] = "1"

    class Child(Base):
        def test_two(self) -> None:
            os.environ["ACCELERATE_FROM_CHILD"] = "1"

    Child().test_one()
    Child().test_two()
    assert "ACCELERATE_FROM_BASE" not in os.environ and "ACCELERATE_FROM_CHILD" not in os.environ
