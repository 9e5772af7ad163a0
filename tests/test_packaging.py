"""The package users install: the built wheel carries everything a run reads (the catalog, the levels, the manifests,
the parity and behaviour tables, the stand-in device packages), its license is an SPDX expression with the file
beside it, and a fresh environment where the README's install commands ran, as written, from a copy of the clone
(their dependencies borrowed from this venv, never the source tree) lists the suite and dry-runs a script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests import readme

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: Files a run reads besides code, as the wheel must name them.
DATA = ("accelerate_ref/PARITY.toml", "accelerate_ref/DIFFERENTIAL.toml", "conformance/catalog.md", "conformance/levels.toml",
        "conformance/documented_names.json", "conformance/device_independent.toml", "conformance/manifests/accelerate.toml",
        "simulators/devices/sites/xla/torch_xla/__init__.py", "simulators/devices/sites/npu/torch_npu/__init__.py",
        "simulators/devices/sites/cuda/torch_cuda_sim/__init__.py")
SCRIPT = textwrap.dedent("""\
    import torch
    import accelerate_ref
    model = torch.nn.Linear(64, 64).cuda()
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    print("from", accelerate_ref.__file__)
    """)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the clone as it is checked out (an in-tree build would read a stale ``build/`` left by another)."""
    tree = tmp_path_factory.mktemp("source") / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", "_build", "reports"))
    return tree


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, source) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("accelerate_ref-*.whl")
    return built


def test_the_wheel_carries_what_a_run_reads_and_its_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert [name for name in DATA if name not in names] == []
    assert not [name for name in names if "__pycache__" in name]
    metadata = zipfile.ZipFile(wheel).read(next(name for name in names if name.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)


def test_the_readmes_install_commands_make_an_environment_that_lists_the_suite_and_dry_runs(source, tmp_path):
    """Each ``pip install`` line of the README, as written, in the copy of the clone, with ``pip`` the fresh
    environment's. No network: pip's index is off and the build uses this venv's setuptools; every dependency and
    every extra's is found installed (this venv's packages, borrowed), which also checks that the extras exist."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    # The dependencies (pip and setuptools too), borrowed as a plain path: this venv's .pth files (its editable
    # install) stay unread.
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installs = [command for command, _ in readme.commands() if command.startswith("pip install")]
    assert len(installs) == 2, installs
    offline = {"PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for command in installs:
        done = subprocess.run(["bash", "-c", f'pip() {{ "{python}" -m pip "$@"; }}; {command}'], cwd=source,
                              env={**os.environ, **offline}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"$ {command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    work = tmp_path / "work"
    work.mkdir()
    listed = subprocess.run([str(python), "-m", "conformance", "list"], capture_output=True, text=True, cwd=work, timeout=300)
    assert listed.returncode == 0 and "catalog IDs covered" in listed.stdout, listed.stderr[-2000:]
    (work / "train.py").write_text(SCRIPT)
    ran = subprocess.run([str(venv / "bin" / "accelerate-ref"), "launch", "--simulate", "cuda", "--num_processes", "1",
                          "--gpu", "l4-24gb", "--timeout", "240", "train.py"], capture_output=True, text=True, cwd=work, timeout=300)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert f"from {site}/accelerate_ref/__init__.py" in ran.stdout, ran.stdout[-2000:]
    assert "rank 0: peak " in ran.stdout and "fits, " in ran.stdout, ran.stdout[-2000:]
