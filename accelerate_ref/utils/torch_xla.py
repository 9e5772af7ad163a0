"""``install_xla``: install the torch_xla wheel matching the installed torch, in Colab only (catalog ``xla.install_xla``)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys


def _in_colab() -> bool:
    ipython = sys.modules.get("IPython")
    return ipython is not None and "google.colab" in str(ipython.get_ipython())


def xla_install_commands(upgrade: bool = False) -> list[list[str]]:
    """The pip commands: upgrade torch first when asked, then the torch_xla wheel for this torch's ``major.minor``."""
    commands = [["pip", "install", "-U", "torch"]] if upgrade else []
    version = importlib.metadata.version("torch").split("+")[0]
    major_minor = version[: version.rindex(".")]
    wheel = f"https://storage.googleapis.com/tpu-pytorch/wheels/colab/torch_xla-{major_minor}-cp37-cp37m-linux_x86_64.whl"
    return commands + [["pip", "install", wheel]]


def install_xla(upgrade: bool = False) -> None:
    """Run ``xla_install_commands`` in Google Colab; anywhere else raise RuntimeError and change nothing."""
    if not _in_colab():
        raise RuntimeError("`install_xla` works only in Google Colab; nothing was installed")
    for command in xla_install_commands(upgrade):
        subprocess.run(command, check=True)
