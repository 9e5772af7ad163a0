"""Mock accelerators for simulated worlds: XLA (TPU-shaped), NPU (Ascend-shaped) and CUDA (GPU-shaped).

A world runs on a mock device family when every rank finds the family's
stand-in package first on its import path: ``torch_xla`` (torch-xla 2.9's
API; :mod:`simulators.devices.families.xla`), ``torch_npu`` (:mod:`simulators.devices.families.npu`)
or ``torch_cuda_sim`` (:mod:`simulators.devices.families.cuda`, which torch loads at
``import torch``), each with a ``.dist-info`` so that ``importlib.util.find_spec`` and
``importlib.metadata`` find them as installed packages. Importing the
package installs the mock; worlds that do not ask for a family never see
it. :func:`world_settings` gives what a rank needs; the launcher and the rank
pool take it as ``pythonpath`` and ``env``::

    settings = world_settings("xla")
    RankPool(world, pythonpath=[*settings.pythonpath, *sys.path], env=settings.env)

Device tensors compute on CPU payloads and refuse to mix with CPU tensors
(:mod:`simulators.devices.families.tensor`), so device-placement bugs show up on a
laptop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: The mock device families.
KINDS = ("xla", "npu", "cuda")
_SITES = Path(__file__).resolve().parent / "sites"
#: Environment of each family's worlds: XLA worlds run torch-xla's PJRT runtime on CPU devices;
#: DDP in CUDA worlds copies inputs without a side stream (the mock's streams are no real ones).
_ENV = {"xla": {"PJRT_DEVICE": "CPU"}, "npu": {}, "cuda": {"PYTORCH_DDP_USE_SIDE_STREAM": "0"}}


@dataclass(frozen=True)
class DeviceWorld:
    """What every rank of a world on a mock device needs: import path entries (first) and environment."""

    pythonpath: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def world_settings(kind: str) -> DeviceWorld:
    """The settings of a world on the mock device family ``kind`` (``"xla"``, ``"npu"`` or ``"cuda"``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown mock device {kind!r}; choose one of {', '.join(KINDS)}")
    return DeviceWorld((str(_SITES / kind),), dict(_ENV[kind]))


__all__ = ["KINDS", "DeviceWorld", "world_settings"]
