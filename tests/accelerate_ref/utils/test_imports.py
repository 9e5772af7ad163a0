"""Catalog: env.checks (is_torch_version, is_bf16_available, is_*_available answer truthfully)."""

import importlib.metadata
import importlib.util
import stat
import sys
from types import SimpleNamespace

import accelerate.utils.environment as hf_environment  # noqa: E402
import accelerate.utils.imports as hf_imports  # noqa: E402
import pytest
import torch
from packaging.version import Version, parse

import accelerate_ref.utils as ref_utils  # noqa: E402
import accelerate_ref.utils as utils
from accelerate_ref.utils import compare_versions, is_torch_version
from accelerate_ref.utils import imports as ref_imports  # noqa: E402

TORCH_VERSION = parse(importlib.metadata.version("torch"))


def test_is_torch_version():
    """env.checks: the documented `is_torch_version(">=", "2.0")` on torch 2.x."""
    assert is_torch_version(">=", "2.0") is (TORCH_VERSION >= Version("2.0"))
    assert is_torch_version("<", "2.0") is (TORCH_VERSION < Version("2.0"))
    assert is_torch_version("==", str(TORCH_VERSION))
    assert is_torch_version("!=", "0.1")
    assert is_torch_version(">", f"{TORCH_VERSION.major + 1}.0") is False


def test_is_torch_version_reads_torchs_metadata_once_at_import_as_hf(monkeypatch):
    """HF 1.15 reads torch's version into ``accelerate.utils.versions.torch_version`` at import and compares with
    it; so does the reference: a check made later reads no metadata (each read parses a distribution's METADATA)."""
    from accelerate.utils.versions import torch_version as hf_torch_version

    from accelerate_ref.utils.versions import torch_version

    assert torch_version == hf_torch_version == TORCH_VERSION

    def no_metadata(name):
        raise AssertionError(f"metadata of {name!r} read again")

    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    assert is_torch_version(">=", "2.0")


def test_compare_versions():
    assert compare_versions(Version("1.2"), "<", "1.10")  # numeric, not lexicographic
    assert compare_versions("numpy", ">=", "1.0")
    with pytest.raises(ValueError, match="'=>'"):
        compare_versions("numpy", "=>", "1.0")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        compare_versions("accelerate-ref-no-such-dist", ">=", "1.0")


# Checks whose meaning is the same in HF accelerate 1.15: both must answer alike here.
SAME_AS_HF = [
    "is_cuda_available", "is_bf16_available", "is_mps_available", "is_xpu_available", "is_npu_available",
    "is_mlu_available", "is_musa_available", "is_torch_xla_available", "is_fp8_available",
    "is_deepspeed_available", "is_transformers_available", "is_datasets_available", "is_peft_available",
    "is_tensorboard_available", "is_wandb_available", "is_comet_ml_available", "is_aim_available",
    "is_mlflow_available", "is_clearml_available", "is_dvclive_available", "is_rich_available",
    "is_tqdm_available", "is_torchvision_available", "is_torchdata_available", "is_msamp_available",
    "is_transformer_engine_available", "is_torchao_available", "is_torch_distributed_available",
]


@pytest.mark.parametrize("name", SAME_AS_HF)
def test_same_answer_as_hf(name):
    """env.checks: on this machine each check agrees with HF accelerate's."""
    hf_imports = pytest.importorskip("accelerate.utils.imports")
    assert bool(getattr(utils, name)()) == bool(getattr(hf_imports, name)())


def test_this_machine():
    """env.checks: a CPU-only torch with safetensors, bf16 on CPU, no device plugins."""
    assert utils.is_safetensors_available() is True
    assert utils.is_bf16_available() is True
    assert utils.is_cuda_available() is torch.cuda.is_available()
    assert utils.is_torch_xla_available() is ("torch_xla" in sys.modules or _importable("torch_xla"))
    assert utils.is_tpu_available() is False


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.fixture
def fake_packages(tmp_path, monkeypatch):
    """Write packages under tmp_path (with installed metadata, as pip leaves, unless ``installed=False``) and put
    it first on sys.path; forget them afterwards."""
    created = []

    def make(name, files, installed=True):
        for relative, text in files.items():
            path = tmp_path / name / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if installed:
            metadata = tmp_path / f"{name}-1.0.dist-info" / "METADATA"
            metadata.parent.mkdir(parents=True, exist_ok=True)
            metadata.write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        created.append(name)

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for module in [m for m in sys.modules if m.split(".")[0] in created]:
        del sys.modules[module]


def test_package_checks_do_not_import(fake_packages, monkeypatch):
    """env.checks: a package counts as available when it can be found; it is not imported."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("wandb", "deepspeed")]:
        monkeypatch.delitem(sys.modules, name)  # imported for real by an earlier test (the tracker tests): set aside
    fake_packages("wandb", {"__init__.py": "raise RuntimeError('imported by an availability check')\n"})
    fake_packages("deepspeed", {"__init__.py": "raise RuntimeError('imported by an availability check')\n"})
    assert utils.is_wandb_available() is True
    assert utils.is_deepspeed_available() is True
    assert "wandb" not in sys.modules and "deepspeed" not in sys.modules


def test_library_checks_answer_as_hf(fake_packages):
    """env.checks, HF 1.15's answers: None for a package that is not found, False for a folder of that name
    without installed metadata, True for an installed one."""
    assert utils.is_peft_available() is (True if _importable("peft") else None)
    fake_packages("schedulefree", {"__init__.py": ""}, installed=False)
    assert utils.is_schedulefree_available() is False
    fake_packages("timm", {"__init__.py": ""})
    assert utils.is_timm_available() is True


def test_rich_is_opt_in(fake_packages, monkeypatch):
    """As HF 1.15: an installed rich counts only with ACCELERATE_ENABLE_RICH=1."""
    fake_packages("rich", {"__init__.py": ""})
    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    assert utils.is_rich_available() is False
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "1")
    assert utils.is_rich_available() is True


def test_npu_plugin_detection(fake_packages, monkeypatch):
    """env.checks: a (mock) torch_npu on sys.path that provides torch.npu is detected."""
    assert utils.is_npu_available() is _importable("torch_npu")
    fake_packages("torch_npu", {"__init__.py": ""})
    devices = SimpleNamespace(is_available=lambda: True, device_count=lambda: 2)
    monkeypatch.setattr(torch, "npu", devices, raising=False)
    assert utils.is_npu_available() is True
    assert utils.is_npu_available(check_device=True) is True

    def no_device():
        raise RuntimeError("no NPU found")

    monkeypatch.setattr(devices, "device_count", no_device)
    assert utils.is_npu_available() is True
    assert utils.is_npu_available(check_device=True) is False
    monkeypatch.setattr(devices, "is_available", lambda: False)
    assert utils.is_npu_available() is False


def test_npu_plugin_that_fails_to_import(fake_packages):
    fake_packages("torch_npu", {"__init__.py": "raise ImportError('no CANN toolkit')\n"})
    assert utils.is_npu_available() is False


def test_xla_detection(fake_packages, monkeypatch):
    """env.checks, xla.distributed_type: a (mock) torch_xla is found; TPU vs GPU from its runtime."""
    fake_packages("torch_xla", {"__init__.py": "", "runtime.py": "def device_type():\n    return 'TPU'\n"})
    monkeypatch.delenv("USE_TORCH_XLA", raising=False)
    assert utils.is_torch_xla_available() is True
    assert utils.is_torch_xla_available(check_is_tpu=True) is True
    assert utils.is_torch_xla_available(check_is_gpu=True) is False
    assert utils.is_tpu_available() is True
    assert utils.is_bf16_available() is True
    assert utils.is_bf16_available(ignore_tpu=True) is False
    with pytest.raises(ValueError):
        utils.is_torch_xla_available(check_is_tpu=True, check_is_gpu=True)
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    assert utils.is_torch_xla_available() is False
    assert utils.is_tpu_available() is False


def test_fp8_engines(fake_packages):
    assert utils.is_fp8_available() is any(map(_importable, ("msamp", "transformer_engine", "torchao")))
    fake_packages("transformer_engine", {"__init__.py": ""})
    assert utils.is_fp8_available() is True


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize(
    "call",
    [
        "is_bnb_available()",
        "is_bnb_available('0.1')",
        "is_bnb_available(min_version='99.0')",
        "is_4bit_bnb_available()",
        "is_8bit_bnb_available()",
        "is_bitsandbytes_multi_backend_available()",
        "is_transformer_engine_mxfp8_available()",
        "is_torchao_available()",
    ],
)
def test_package_checks_answer_as_hf(call):
    answer = eval(f"ref.{call}", {"ref": ref_utils})
    assert isinstance(answer, bool) and answer == bool(eval(f"hf.{call}", {"hf": hf_imports}))  # HF may answer None for False


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_bnb_checks_without_bitsandbytes(monkeypatch):
    monkeypatch.setattr(ref_imports, "_is_package_available", lambda name: name != "bitsandbytes")
    checks = [ref_utils.is_bnb_available(), ref_utils.is_bnb_available("0.1"), ref_utils.is_4bit_bnb_available()]
    assert checks + [ref_utils.is_8bit_bnb_available(), ref_utils.is_bitsandbytes_multi_backend_available()] == [False] * 5


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_mxfp8_asks_transformer_engine(monkeypatch, tmp_path):
    """With TransformerEngine installed, its own check_mxfp8_support() answers."""
    package = tmp_path / "transformer_engine" / "pytorch"
    package.mkdir(parents=True)
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "fp8.py").write_text("def check_mxfp8_support():\n    return SUPPORTED, 'why'\nSUPPORTED = True\n")
    metadata = tmp_path / "transformer_engine-1.0.dist-info" / "METADATA"  # installed, as HF's check requires
    metadata.parent.mkdir()
    metadata.write_text("Metadata-Version: 2.1\nName: transformer-engine\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert ref_utils.is_transformer_engine_mxfp8_available() is True
        import transformer_engine.pytorch.fp8 as fake

        monkeypatch.setattr(fake, "SUPPORTED", False)
        assert ref_utils.is_transformer_engine_mxfp8_available() is False
    finally:
        for name in [m for m in list(sys.modules) if m.startswith("transformer_engine")]:
            del sys.modules[name]


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("available", [True, False])
def test_torchao_required_as_hf(monkeypatch, available):
    monkeypatch.setattr(ref_imports, "is_torchao_available", lambda: available)
    monkeypatch.setattr(hf_imports, "is_torchao_available", lambda: available)
    outcomes = []
    for decorator in (ref_utils.torchao_required, hf_imports.torchao_required):

        @decorator
        def double(x: int) -> int:
            """Twice x."""
            return 2 * x

        try:
            outcomes.append((double.__name__, double.__doc__, double(21)))
        except ImportError as error:
            outcomes.append((double.__name__, double.__doc__, str(error)))
    assert outcomes[0] == outcomes[1]


def _fake_nvidia_smi(directory, output: str) -> None:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
@pytest.mark.parametrize("output", ["9.0\\n8.0\\n", "8.6\\n", "8.9\\n", "12.0\\n"])
def test_fp8_capability_from_nvidia_smi_as_hf(monkeypatch, tmp_path, output):
    _fake_nvidia_smi(tmp_path, output)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ref_utils.check_cuda_fp8_capability() is hf_environment.check_cuda_fp8_capability()


@pytest.mark.filterwarnings('ignore:FP8RecipeKwargs is deprecated:FutureWarning')
@pytest.mark.usefixtures("no_fp8_environment")
@pytest.mark.usefixtures("fresh_fp8_capability")
def test_fp8_capability_falls_back_to_torch_as_hf(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert ref_utils.check_cuda_fp8_capability() is hf_environment.check_cuda_fp8_capability() is False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert ref_utils.check_cuda_fp8_capability() is False  # cached, as HF's
    ref_utils.check_cuda_fp8_capability.cache_clear()
    hf_environment.check_cuda_fp8_capability.cache_clear()
    assert ref_utils.check_cuda_fp8_capability() is hf_environment.check_cuda_fp8_capability() is True
